"""What a built-in task is: the parts a run takes from it when the user names no dataset, reward
or model. A task module builds one :class:`Task`; ``gmpo_tasks.registry.TASKS`` lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Task:
    """A built-in task.

    ``name``: what ``--task`` takes. ``about``: one sentence for ``--help``. ``dataset(seed)``: the
    prompts (a ``datasets.Dataset`` with a ``prompt`` column). ``reward``: a TRL reward function
    ``reward(prompts, completions, **kw)``. ``model(seed, heads=4)``: ``(model, tokenizer)``, the
    model with ``heads`` attention heads (``gmpo --use_vllm`` asks for fewer, wider ones),
    warm-started where the task has a warm start. ``trainer_args(output_dir)``: the
    ``GMPOConfig`` / ``GRPOConfig`` keyword arguments of the task's built-in run. ``lengths()``,
    where the built-in model has a fixed number of positions: ``(prompt tokens, model positions,
    answer tokens)``, which ``gmpo`` checks the completion length against before any work."""

    name: str
    about: str
    dataset: Callable[[int], Any]
    reward: Callable[..., list[float]]
    model: Callable[..., tuple[Any, Any]]
    trainer_args: Callable[[str], dict[str, Any]]
    lengths: Callable[[], tuple[int, int, int]] | None = None
