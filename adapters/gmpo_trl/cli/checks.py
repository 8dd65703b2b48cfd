"""What the user named, checked before any work is done: the model, the dataset and the reward
functions (:func:`check_model`, :func:`check_dataset`, :func:`resolve_reward`, which the up-front
checks of :mod:`gmpo_trl.cli.upfront` call before TRL is imported), and the config values that TRL takes as given until deep in
the run or after it (:func:`check_counts`, :func:`check_run`): each failure is one line
(:class:`~gmpo_trl.cli.errors.CLIError`)."""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gmpo_tasks.task import Task
from gmpo_trl.cli.comparators import COMPARATORS
from gmpo_trl.cli.errors import CLIError
from gmpo_trl.cli.model_checks import check_hub_id

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def _is_path_like(spec: str) -> bool:
    """A spec that can only be a local path (not ``name`` or ``owner/name``)."""
    return (
        spec.startswith(("/", ".", "~"))
        or os.sep in spec.replace("/", "", 1)
        or (_HUB_ID.fullmatch(spec) is None)
    )


def check_model(spec: str) -> None:
    """A local model directory must exist and hold config.json; anything else is a hub id."""
    accepted = (
        "give a local model directory (with config.json, as save_pretrained writes it) or a "
        "hub id such as Qwen/Qwen2.5-Math-1.5B"
    )
    path = Path(spec).expanduser()
    if path.exists():
        if not (path.is_dir() and (path / "config.json").is_file()):
            raise CLIError(f"--model {spec!r}: not a model directory (no config.json); {accepted}")
    elif _is_path_like(spec):
        raise CLIError(f"--model {spec!r}: no such directory; {accepted}")
    else:
        check_hub_id(spec, accepted)  # one line at once where no hub will give it


_DATA_KINDS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_DATA_ACCEPTED = (
    "give a hub id, a local directory, or a .json/.jsonl/.csv/.parquet file with a 'prompt' column"
)


def check_dataset(spec: str) -> None:
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix not in _DATA_KINDS:
            raise CLIError(f"--dataset {spec!r}: not a .json/.jsonl/.csv/.parquet file; "
                           f"{_DATA_ACCEPTED}")  # fmt: skip
    elif not path.is_dir() and (_is_path_like(spec) or path.suffix in _DATA_KINDS):
        raise CLIError(f"--dataset {spec!r}: no such file or directory; {_DATA_ACCEPTED}")


def resolve_reward(spec: str) -> Callable[..., Any]:
    """``module:function`` to the function; the current directory is searched too (a console
    script's sys.path does not hold it)."""
    accepted = "give module:function, the module in the current directory or on PYTHONPATH"
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"--reward {spec!r}: not module:function; {accepted}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.startswith(err.name):
            raise CLIError(f"--reward {spec!r}: no module {err.name!r} found; {accepted}") from err
        raise CLIError(f"--reward {spec!r}: importing {module_name!r} failed: {err}") from err
    except Exception as err:  # the user's module raised while importing
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CLIError(f"--reward {spec!r}: importing {module_name!r} failed: {line}") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CLIError(f"--reward {spec!r}: module {module_name} has no function {attr!r}; "
                       f"{accepted}")  # fmt: skip
    return fn  # type: ignore[no-any-return]


def load_dataset(spec: str, split: str) -> Any:
    """The dataset ``spec`` names (which :func:`check_dataset` accepted), with a 'prompt'
    column."""
    import datasets

    path = Path(spec).expanduser()
    try:
        if path.is_file():
            data = datasets.load_dataset(
                _DATA_KINDS[path.suffix], data_files=str(path), split=split
            )
        else:
            data = datasets.load_dataset(str(path) if path.is_dir() else spec, split=split)
    except Exception as err:  # datasets raises many types; the user needs the one line
        raise CLIError(f"--dataset {spec!r}: {str(err).splitlines()[0]}") from err
    if "prompt" not in data.column_names:
        raise CLIError(f"--dataset {spec!r}: no 'prompt' column (columns: {data.column_names})")
    return data


#: TrainingArguments / GRPOConfig counts that TRL takes as given (0 ends in a ZeroDivisionError
#: or a sampler's ValueError, deep in the run); None: the option's own rule decides.
COUNT_OPTIONS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "num_iterations",
    "steps_per_generation",
)


def check_counts(values: dict[str, Any]) -> None:
    """The counts of :data:`COUNT_OPTIONS` are integers >= 1 (or None)."""
    for name in COUNT_OPTIONS:
        value = values.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise CLIError(f"--{name} must be an integer >= 1, got {value!r}")


def check_run(config: Any) -> None:
    """What TRL checks only once the run is under way (or never): the seed, the learning rate,
    and an output directory that cannot be one."""
    check_seeds(config.seed)
    lr = config.learning_rate
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr >= 0):
        raise CLIError(f"--learning_rate must be a finite number >= 0, got {lr!r}")
    check_output_dir(config.output_dir)
    check_report_to(config.report_to)


#: the largest seed: the trainer seeds NumPy (``transformers.set_seed``), whose seeds are 32-bit
MAX_SEED = 2**32 - 1


def check_seeds(first: int, count: int = 1) -> None:
    """Every seed of a run (``gmpo compare``'s ``--seeds``: ``first`` to ``first + count - 1``)
    is one the trainer takes, 0 to :data:`MAX_SEED`: refused here rather than when the trainer of
    an out-of-range seed is built, after the runs before it."""
    last = first + count - 1
    if 0 <= first and last <= MAX_SEED:
        return
    runs = f" with --seeds {count} runs seeds {first} to {last}" if count > 1 else ""
    raise CLIError(f"--seed {first}{runs}: a seed must be an integer from 0 to {MAX_SEED}")


def check_output_dir(spec: str) -> None:
    """The output directory, or its nearest existing parent, is a directory (it is made later)
    in which a file can be created (tried: permission bits do not bind root, a read-only
    filesystem does)."""
    path = Path(spec).expanduser()
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                raise CLIError(
                    f"--output_dir {spec!r}: {str(existing)!r} is a file, not a directory"
                )
            _check_writable(spec, existing)
            return


def _check_writable(spec: str, directory: Path) -> None:
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=directory, prefix=".gmpo-write-check-"):
            pass
    except OSError as err:
        raise CLIError(
            f"--output_dir {spec!r}: cannot create files in {str(directory)!r} "
            f"({err.strerror or type(err).__name__})"
        ) from err


#: report_to integrations whose login is checked before the run (they fail at its first step)
_PIP_NAMES = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}


def check_report_to(report_to: Any) -> None:
    """Each ``--report_to`` integration is installed, and wandb is logged in (or offline):
    without, the Trainer fails at the start of training (after the model and data are loaded)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = [n for n in names if n not in ("none", "all")]  # TrainingArguments resolves "all"
    if not names:
        return
    from transformers.integrations import get_available_reporting_integrations

    available = set(get_available_reporting_integrations())
    for name in names:
        if name == "wandb":
            _check_wandb()
        elif name not in available:
            raise CLIError(
                f"--report_to {name}: not installed (pip install {_PIP_NAMES.get(name, name)}), "
                "or leave it out of --report_to"
            )


def _check_wandb() -> None:
    """wandb imports, and has an API key unless WANDB_MODE is offline or disabled (its own
    ``wandb.login``, without verifying the key over the network; on a terminal it asks)."""
    try:
        import wandb
    except ImportError as err:
        raise CLIError(
            "--report_to wandb: wandb is not installed (pip install wandb), or leave it out of "
            "--report_to"
        ) from err
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return
    try:
        wandb.login(verify=False)
    except Exception as err:  # wandb's UsageError (no key, no terminal) and the like
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CLIError(
            f"--report_to wandb: not logged in ({line}); run `wandb login`, set WANDB_API_KEY, or "
            "set WANDB_MODE=offline"
        ) from err


def check_grpo_epsilon(value: Any) -> float:
    """``gmpo compare``'s GRPO clip: a finite number in (0, 1), so that the ratio range
    [1 - eps, 1 + eps] has a positive lower bound (TRL checks none of it)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise CLIError(
            "--grpo_epsilon must be a finite number in (0, 1) (GRPO's ratio clip [1 - eps, "
            f"1 + eps]), got {value!r}"
        )
    return float(value)


def check_against(value: Any, grpo_epsilon_set: bool) -> list[str]:
    """``gmpo compare --against``: the names, comma-separated (or a YAML list), each one of
    :data:`~gmpo_trl.cli.comparators.COMPARATORS`, none twice; ``--grpo_epsilon`` (set by the
    user) only with ``grpo`` among them."""
    choices = ", ".join(COMPARATORS)
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, list | tuple) or not all(isinstance(p, str) for p in parts):
        raise CLIError(f"--against: give loss names, comma-separated, from {choices}; got "
                       f"{value!r}")  # fmt: skip
    names = [p.strip() for p in parts]
    for name in names:
        if name not in COMPARATORS:
            raise CLIError(f"--against: unknown loss {name!r} (choose from {choices})")
    if not names or len(set(names)) != len(names):
        raise CLIError(f"--against: give each loss once, from {choices}; got {value!r}")
    if grpo_epsilon_set and "grpo" not in names:
        raise CLIError("--grpo_epsilon is GRPO's clip: add grpo to --against, or leave it out")
    return names


def check_task_lengths(
    task: Task, lengths: tuple[int, int, int] | None, config: Any, script: Any, command: str
) -> None:
    """A built-in model with a fixed number of positions (the reverse task's: learned
    positions) holds the prompt and the longest completion (beyond, generation ends in an
    IndexError after the warm start); a completion shorter than the task's answer cannot earn
    its reward: a warning. ``lengths``: the task's (:meth:`gmpo_tasks.task.Task.lengths`), for
    a run on the task's model and dataset."""
    if lengths is None:
        return
    prompt, positions, answer = lengths
    n = config.max_completion_length
    if n is not None and prompt + n > positions:
        raise CLIError(
            f"--max_completion_length {n}: the {task.name} task's prompt ({prompt} tokens) and "
            f"completion need {prompt + n} positions, its model has {positions}; give at most "
            f"{positions - prompt}"
        )
    if n is not None and n < answer and not script.reward:
        print(
            f"gmpo {command}: warning: --max_completion_length {n} is shorter than the "
            f"{task.name} task's answer ({answer} tokens): no completion can earn its "
            "exact-match reward",
            file=sys.stderr,
        )


_RESUME_ACCEPTED = (
    "give a checkpoint directory (checkpoint-N, as --save_steps writes them) or true (the last "
    "one in --output_dir)"
)


def check_resume(value: str | None, output_dir: str) -> str | None:
    """``--resume_from_checkpoint``: the checkpoint directory to resume from, or None (not set,
    or ``false``). ``true`` is the last ``checkpoint-N`` in ``output_dir``, as
    ``Trainer.train(resume_from_checkpoint=True)`` takes it; a directory must hold the trainer
    state (``trainer_state.json``), without which transformers would restart at step 0."""
    if value is None or str(value).lower() == "false":
        return None
    if str(value).lower() == "true":
        from transformers.trainer_utils import get_last_checkpoint

        out = Path(output_dir).expanduser()
        last = get_last_checkpoint(str(out)) if out.is_dir() else None
        if last is None:
            raise CLIError(f"--resume_from_checkpoint true: no checkpoint-N directory in "
                           f"--output_dir {output_dir!r}; {_RESUME_ACCEPTED}")  # fmt: skip
        value = last
    path = Path(value).expanduser()
    if not path.is_dir():
        raise CLIError(f"--resume_from_checkpoint {value!r}: no such directory; {_RESUME_ACCEPTED}")
    if not (path / "trainer_state.json").is_file():
        raise CLIError(f"--resume_from_checkpoint {value!r}: not a checkpoint (no "
                       f"trainer_state.json); {_RESUME_ACCEPTED}")  # fmt: skip
    return str(path)


def check_vllm(script: Any, config: Any) -> None:
    """``--use_vllm``: what vLLM needs (:func:`gmpo_trl.vllm_cpu.check_vllm`: installed, the mode,
    the model's path and head_dim), before any model or engine is built."""
    if not config.use_vllm:
        return
    from gmpo_trl import vllm_cpu

    try:
        vllm_cpu.check_vllm(script.model, config)
    except ValueError as err:
        raise CLIError(str(err)) from err
