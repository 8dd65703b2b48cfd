"""What the commands share before TRL is imported: the error type, the TRL options ``--help``
shows, and the defaults of a run (the toy run's, each command's, the CPU's).

A run's values, lowest precedence first: the config dataclass's defaults, the CPU defaults (no
accelerator: ``use_cpu``, no ``bf16``), the toy defaults (no ``--model``), the command's own
defaults, the YAML file (``--config``), the command line, and what a command forces (``compare``'s
GRPO loss and clip). :func:`run_defaults` is the middle three.
"""

from __future__ import annotations

from typing import Any

TASKS = ("successor", "reverse")  # the built-in tasks (--task); the toy run's is the first
USAGE = "usage: gmpo {train,compare} [-h] [--help-all] [--model PATH_OR_HUB_ID] [options]"
COMMANDS = ("train", "compare")


class CLIError(Exception):
    """A user error: reported as one line, no traceback."""


class Interrupted(Exception):
    """Ctrl-C during training: the run's outputs for the steps done are written; its message is
    the one line, and the exit status 130 (128 + SIGINT)."""


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
    "use_vllm": ("BOOL", False, "Generate with vLLM (GPU; pip install vllm)."),
    "logging_steps": ("N", 10, "Log (metrics.jsonl, progress bar) every N optimizer steps."),
}

#: compare: off-policy passes (num_iterations > 1) also with --model; on-policy every r is 0
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {"compare": {"num_iterations": 2}}


def default_output_dir(command: str) -> str:
    return f"gmpo_{command}_output"


def toy_defaults(output_dir: str) -> dict[str, Any]:
    """The config values of the built-in toy run (no --model)."""
    from gmpo_trl import toy

    return toy.toy_args(
        output_dir,
        disable_tqdm=False,
        # two optimizer steps per generation, two passes over each batch: updates are off-policy,
        # so the trust region acts and the log-ratio plot shows something (on-policy, r = 0)
        num_iterations=2,
        steps_per_generation=2,
    )


#: the reverse task's run (--task reverse, no --model): 100 generations of 16 prompts x 8
#: completions, 16 optimizer steps on each, no gradient clipping, at the learning rate where the
#: study (docs/study.md) separates the methods most (reverse_args: 2e-3)
REVERSE_ROLLOUTS = 100


def reverse_defaults(output_dir: str) -> dict[str, Any]:
    """The config values of the built-in reverse run (``--task reverse``, no --model)."""
    from gmpo_trl.reverse import ReverseTask
    from gmpo_trl.reverse_trl import reverse_args

    return reverse_args(output_dir, ReverseTask(), rollouts=REVERSE_ROLLOUTS, disable_tqdm=False)


def toy_settings(command: str) -> dict[str, Any]:
    """The GMPOConfig values of the built-in toy run (no --model), beyond output_dir."""
    args = {**toy_defaults(default_output_dir(command)), **COMMAND_DEFAULTS.get(command, {})}
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
    command: str, *, model: str | None, output_dir: str | None, task: str = TASKS[0]
) -> dict[str, Any]:
    """The values a run gets unless the user sets them: the CPU defaults without an accelerator,
    the built-in task's defaults (the toy's, or the reverse task's) without a model, then the
    command's own."""
    out = output_dir or default_output_dir(command)
    base: dict[str, Any] = {"output_dir": out, "report_to": []}
    if not has_accelerator():
        base.update(use_cpu=True, bf16=False)
    if model is None:
        base.update(reverse_defaults(out) if task == "reverse" else toy_defaults(out))
    return {**base, **COMMAND_DEFAULTS.get(command, {})}
