"""What the commands share before TRL is imported: the TRL options ``--help`` shows, and the
defaults of a run (the built-in task's, a pretrained model's, each command's, the CPU's).

A run's values, lowest precedence first: the config dataclass's defaults, the CPU defaults (no
accelerator: ``use_cpu``, no ``bf16``), a pretrained model's (:data:`MODEL_DEFAULTS`: ``--model``,
or a task's own pretrained model), the built-in task's (without ``--dataset``: its own
settings; a tiny-model task's only without ``--model``: ``gmpo_tasks.catalog.TASKS``), the command's own defaults, the YAML
file (``--config``), the command line, and what a command forces (``compare``'s GRPO loss and
clip). :func:`run_defaults` is the middle four; ``gmpo train`` and ``gmpo compare`` share them.
"""

from __future__ import annotations

from typing import Any

from gmpo_tasks.catalog import TASKS, check_available
from gmpo_trl import device
from gmpo_trl.cli.errors import CLIError
from gmpo_trl.device import has_accelerator as has_accelerator  # the rule's, re-exported

#: What a run on a pretrained model (``--model``, or a chat task's own) gets where TRL's
#: defaults suit long runs on many GPUs rather than a short one: two passes over each generation
#: (``num_iterations=2``: the second is off-policy, so GMPO's clip acts; on-policy every
#: r = logp - old_logp is 0), a learning rate that moves a small model in tens of steps (TRL's
#: 1e-6 left 20 steps of SmolLM2-135M flat: docs/real_model.md), every step logged, and no
#: checkpoints unless asked (--save_strategy steps: a 135M model's optimizer state is 1 GB).
MODEL_DEFAULTS: dict[str, Any] = {
    "num_iterations": 2,
    "learning_rate": 1e-05,
    "logging_steps": 1,
    "save_strategy": "no",
}

#: The TRL (GRPOConfig / TrainingArguments) options most runs set, with the default a run with
#: --model gets (GMPOConfig's, or :data:`MODEL_DEFAULTS`'). Listed here so that ``--help`` needs
#: no TRL import (seconds); tests/trl/test_cli_outputs.py checks each default against them.
COMMON_TRL_OPTIONS: dict[str, tuple[str, Any, str]] = {
    "output_dir": ("DIR", None, "Where metrics, plots and the model go."),
    "learning_rate": ("LR", 1e-05, "AdamW learning rate (TRL's: 1e-6)."),
    "max_steps": ("N", -1, "Optimizer steps (-1: num_train_epochs passes)."),
    "num_train_epochs": ("N", 3.0, "Passes over the dataset when max_steps is -1."),
    "per_device_train_batch_size": ("N", 8, "Completions per device per micro-batch."),
    "gradient_accumulation_steps": ("N", 1, "Micro-batches per optimizer step."),
    "num_generations": ("N", 8, "Completions per prompt (the group of GRPO's advantages)."),
    "max_completion_length": ("N", 512, "Longest completion, in tokens."),
    "num_iterations": ("N", 2, "Passes over each generation (> 1: off-policy, GMPO's clip acts)."),
    "beta": ("B", 0.0, "KL coefficient (0: no reference model)."),
    "seed": ("N", 42, "Random seed."),
    "bf16": ("BOOL", None, "bfloat16 mixed precision. Default: true on a GPU, false on CPU."),
    "use_cpu": ("BOOL", None, "Train on the CPU. Default: false; true when no GPU is found."),
    "use_vllm": ("BOOL", False, "Generate with vLLM, on a GPU or the CPU (docs/vllm.md)."),
    "logging_steps": ("N", 1, "Log every N optimizer steps."),
    "save_strategy": ("S", "no", "Checkpoints ('steps': every --save_steps; 1 GB a 135M model)."),
}

#: compare: off-policy passes (num_iterations > 1) also on the toy run
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {"compare": {"num_iterations": 2}}


def default_output_dir(command: str) -> str:
    return f"gmpo_{command}_output"


def task_defaults(task: str, output_dir: str) -> dict[str, Any]:
    """The config values of a built-in task's run: the task's, with the progress bar on."""
    return {**_task(task).trainer_args(output_dir), "disable_tqdm": False}


def _task(name: str) -> Any:
    """The task called ``name`` (a --config file's value, which argparse's choices do not see),
    its extra not checked: the up-front checks do, where the run uses the task
    (``gmpo_trl.cli.upfront.task_of``)."""
    if not isinstance(name, str) or name not in TASKS:
        raise CLIError(f"--task must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]


def default_task(model: str | None, dataset: str | None = None) -> str:
    """The task of a run that names none: the first chat task with ``--model`` (a pretrained
    model) and no ``--dataset``, else the first (the toy run; with a dataset, only its reward is
    used where ``--reward`` is not given, and it needs no extra)."""
    if model is not None and dataset is None:
        return next(name for name, task in TASKS.items() if task.model_name is not None)
    return next(iter(TASKS))


def check_default_task(name: str) -> None:
    """The task a run was given by :func:`default_task` is installed; else one line that says
    why it was chosen and how to choose another."""
    try:
        check_available(TASKS[name])
    except ValueError as err:
        raise CLIError(
            f"{err} (--model without --task or --dataset trains the {name} task; give --task "
            "or --dataset and --reward for another)"
        ) from err


def toy_settings(command: str) -> dict[str, Any]:
    """The GMPOConfig values of the built-in toy run (the first task, no --model), beyond
    output_dir."""
    toy = task_defaults(next(iter(TASKS)), default_output_dir(command))
    args = {**toy, **COMMAND_DEFAULTS.get(command, {})}
    skip = {"output_dir", "report_to", "disable_tqdm", "save_strategy"}
    return {k: v for k, v in args.items() if k not in skip}


def settings(
    command: str,
    *,
    model: str | None,
    output_dir: str | None,
    task: str | None = None,
    dataset: str | None = None,
) -> dict[str, Any]:
    """:func:`run_defaults` but the CPU's (which import torch to look for an accelerator):
    what ``--help`` shows and the up-front checks read."""
    out = output_dir or default_output_dir(command)
    base: dict[str, Any] = {"output_dir": out, "report_to": []}
    chosen = _task(task or default_task(model, dataset))
    pretrained = model is not None or chosen.model_name is not None
    if pretrained:
        base.update(MODEL_DEFAULTS)
    if (chosen.model_name is None and model is None) or (chosen.model_name and dataset is None):
        base.update(task_defaults(chosen.name, out))
    return {**base, **COMMAND_DEFAULTS.get(command, {})}


def run_defaults(
    command: str,
    *,
    model: str | None,
    output_dir: str | None,
    task: str | None = None,
    dataset: str | None = None,
) -> dict[str, Any]:
    """The values a run gets unless the user sets them: the CPU defaults without an accelerator;
    :data:`MODEL_DEFAULTS` on a pretrained model (``model``, or the task's own); the built-in
    task's settings (``task``, by default :func:`default_task`'s): a tiny-model task's where its
    model is trained (no ``model``; they are that model's), a chat task's on its own prompts (no
    ``dataset``); then the command's own."""
    base = device.cpu_defaults()  # GMPOConfig's own rule; GRPO's side of compare needs it too
    return {**base, **settings(command, model=model, output_dir=output_dir, task=task,
                               dataset=dataset)}  # fmt: skip
