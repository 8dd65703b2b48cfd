"""The up-front checks of a ``gmpo`` command line: after it is parsed against the table of
options (:mod:`gmpo_trl.cli.trl_options`, no TRL import) and before TRL, transformers or a model is
imported or loaded, each one line and exit status 2 (README: "A path, dataset or reward that is
not there gets one line ... before anything is loaded").

In order: the model's path, the dataset's, the task (its extra only where the run uses the task:
reasoning-gym is not needed for a user's own model, dataset and reward), the counts and the
sampling settings (:func:`check_sampling`), then each ``--reward`` (imported, and its signature
bound to TRL's call: :mod:`gmpo_trl.rewards`). What needs the dataset's columns is checked once
it is loaded, still before the model (:func:`check_columns`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gmpo_tasks.catalog import TASKS, check_available
from gmpo_tasks.task import Task
from gmpo_trl.cli.checks import check_counts, check_dataset, check_model, resolve_reward
from gmpo_trl.cli.defaults import check_default_task
from gmpo_trl.cli.errors import CLIError
from gmpo_trl.rewards import check_reward


def uses_task(script: Any) -> bool:
    """Whether a run uses its built-in task: its model (no ``--model``), its prompts (no
    ``--dataset``) or its reward (no ``--reward``), or its format reward."""
    return (
        script.model is None
        or script.dataset is None
        or not script.reward
        or bool(getattr(script, "format_reward", False))
    )


def task_of(script: Any) -> Task:
    """The run's task: a known name (a ``--config`` file's value is not argparse's to check),
    its extra installed where the run uses it (:func:`uses_task`)."""
    name = script.task
    if not isinstance(name, str) or name not in TASKS:
        raise CLIError(f"--task must be one of {', '.join(TASKS)}, got {name!r}")
    if uses_task(script):
        try:
            check_available(TASKS[name])
        except ValueError as err:
            raise CLIError(str(err)) from err
    return TASKS[name]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_sampling(values: dict[str, Any]) -> None:
    """The sampling settings, as transformers' ``generate`` (and vLLM) take them: a temperature
    > 0 (GRPOTrainer also divides the logits by it), ``top_p`` in (0, 1], ``top_k`` >= 0 (0:
    off; vLLM's -1 too with ``--use_vllm``), ``min_p`` in [0, 1] and ``repetition_penalty``
    > 0. Unset options (absent, or None where the option allows it) are not checked."""
    t = values.get("temperature")
    if t is not None and not (_number(t) and t > 0):
        raise CLIError(f"--temperature must be a number > 0 (1: the model's own distribution), "
                       f"got {t!r}")  # fmt: skip
    p = values.get("top_p")
    if p is not None and not (_number(p) and 0 < p <= 1):
        raise CLIError(f"--top_p must be a number in (0, 1] (1: off), got {p!r}")
    k = values.get("top_k")
    off = (0, -1) if values.get("use_vllm") else (0,)
    if k is not None and not (
        isinstance(k, int) and not isinstance(k, bool) and (k > 0 or k in off)
    ):
        also = " or -1" if values.get("use_vllm") else ""
        raise CLIError(f"--top_k must be an integer >= 1, or 0{also} (off), got {k!r}")
    m = values.get("min_p")
    if m is not None and not (_number(m) and 0 <= m <= 1):
        raise CLIError(f"--min_p must be a number in [0, 1] (or unset: off), got {m!r}")
    r = values.get("repetition_penalty")
    if r is not None and not (_number(r) and r > 0):
        raise CLIError(f"--repetition_penalty must be a number > 0 (1: off), got {r!r}")


def check_command_line(
    script: Any,
    values: dict[str, Any],
    defaults: Callable[[], dict[str, Any]],
    *,
    task_given: bool = True,
) -> None:
    """The up-front checks of a parsed command line (``script``: the command's arguments;
    ``values``: the config values the user set; ``defaults``: the run's, computed once the task
    is known), in the order of the module's docstring. Imports nothing of TRL; a ``--reward``
    module is imported. ``task_given``: the user named the task (else the refusal of its extra
    says why it was chosen)."""
    if script.model is not None:
        check_model(script.model)
    if script.dataset is not None:
        check_dataset(script.dataset)
    try:
        task_of(script)
    except CLIError:
        if not task_given:
            check_default_task(script.task)  # the same refusal, and why this task
        raise
    merged = {**defaults(), **values}
    check_counts(merged)
    check_sampling(merged)
    for spec in script.reward:
        fn = resolve_reward(spec)
        try:
            check_reward(fn)
        except TypeError as err:
            raise CLIError(f"--reward {spec!r}: {err}") from err


def check_columns(
    rewards: Sequence[Callable[..., Any]], columns: Sequence[str], where: str
) -> None:
    """Each reward function takes TRL's call with the dataset's ``columns``: every column it
    needs is there (``--dataset``'s once loaded, before the model). ``where``: the dataset, as
    the message names it."""
    for fn in rewards:
        try:
            check_reward(fn, columns)
        except TypeError as err:
            raise CLIError(f"{where}: {err}") from err
