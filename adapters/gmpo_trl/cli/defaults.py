"""What the commands share before TRL is imported: the TRL options ``--help`` shows, and the
defaults of a run (the built-in task's, each command's, the CPU's).

A run's values, lowest precedence first: the config dataclass's defaults, the CPU defaults (no
accelerator: ``use_cpu``, no ``bf16``), the built-in task's (no ``--model``:
``gmpo_tasks.catalog.TASKS``), the command's own defaults, the YAML file (``--config``), the
command line, and what a command forces (``compare``'s GRPO loss and clip).
:func:`run_defaults` is the middle three.
"""

from __future__ import annotations

from typing import Any

from gmpo_tasks.catalog import TASKS, get_task
from gmpo_trl.cli.errors import CLIError

#: The TRL (GRPOConfig / TrainingArguments) options most runs set, with the default a run with
#: --model gets. Listed here so that ``--help`` needs no TRL import (seconds);
#: tests/trl/test_cli.py checks each default against GMPOConfig.
COMMON_TRL_OPTIONS: dict[str, tuple[str, Any, str]] = {
    "output_dir": ("DIR", None, "Where metrics, plots and the model go."),
    "learning_rate": ("LR", 1e-06, "AdamW learning rate."),
    "max_steps": ("N", -1, "Optimizer steps (-1: num_train_epochs passes over the dataset)."),
    "num_train_epochs": ("N", 3.0, "Passes over the dataset when max_steps is -1."),
    "per_device_train_batch_size": ("N", 8, "Completions per device per micro-batch."),
    "gradient_accumulation_steps": ("N", 1, "Micro-batches per optimizer step."),
    "num_generations": ("N", 8, "Completions per prompt (the group of GRPO's advantages)."),
    "max_completion_length": ("N", 512, "Longest completion, in tokens."),
    "num_iterations": ("N", 1, "Passes over each generated batch (> 1: off-policy updates)."),
    "beta": ("B", 0.0, "KL coefficient to the reference model (0: no reference model)."),
    "seed": ("N", 42, "Random seed."),
    "bf16": ("BOOL", None, "bfloat16 mixed precision. Default: true on a GPU, false on CPU."),
    "use_cpu": ("BOOL", None, "Train on the CPU. Default: false; true when no GPU is found."),
    "use_vllm": ("BOOL", False, "Generate with vLLM, on a GPU or the CPU (docs/vllm.md)."),
    "logging_steps": ("N", 10, "Log (metrics.jsonl, progress bar) every N optimizer steps."),
}

#: compare: off-policy passes (num_iterations > 1) also with --model; on-policy every r is 0
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {"compare": {"num_iterations": 2}}


def default_output_dir(command: str) -> str:
    return f"gmpo_{command}_output"


def task_defaults(task: str, output_dir: str) -> dict[str, Any]:
    """The config values of a built-in task's run (no --model): the task's, with the progress
    bar on."""
    try:
        builtin = get_task(task)
    except ValueError as err:  # a --config file's value, which argparse's choices do not see
        raise CLIError(str(err)) from err
    return {**builtin.trainer_args(output_dir), "disable_tqdm": False}


def toy_settings(command: str) -> dict[str, Any]:
    """The GMPOConfig values of the built-in toy run (the first task, no --model), beyond
    output_dir."""
    toy = task_defaults(next(iter(TASKS)), default_output_dir(command))
    args = {**toy, **COMMAND_DEFAULTS.get(command, {})}
    skip = {"output_dir", "report_to", "disable_tqdm", "save_strategy"}
    return {k: v for k, v in args.items() if k not in skip}


def has_accelerator() -> bool:
    """Whether torch sees a GPU (CUDA/ROCm), an Apple GPU (MPS) or an Intel GPU (XPU)."""
    import torch

    if torch.cuda.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def run_defaults(
    command: str, *, model: str | None, output_dir: str | None, task: str | None = None
) -> dict[str, Any]:
    """The values a run gets unless the user sets them: the CPU defaults without an accelerator,
    the built-in task's defaults (``task``, by default the first) without a model, then the
    command's own."""
    out = output_dir or default_output_dir(command)
    base: dict[str, Any] = {"output_dir": out, "report_to": []}
    if not has_accelerator():
        base.update(use_cpu=True, bf16=False)
    if model is None:
        base.update(task_defaults(task or next(iter(TASKS)), out))
    return {**base, **COMMAND_DEFAULTS.get(command, {})}
