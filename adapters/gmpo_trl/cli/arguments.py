"""Each command's own arguments (what to train on, and the like), as dataclasses that TRL's
parser reads beside ``GMPOConfig``. No TRL import, and no import of a command module: the
parser, ``--help`` and the commands all read them from here."""

from __future__ import annotations

from dataclasses import dataclass, field

from gmpo_tasks.catalog import TASKS
from gmpo_trl.cli.comparators import COMPARATORS, DEFAULT_AGAINST


def _task_help() -> str:
    choices = " or ".join(f"{name!r} ({task.about})" for name, task in TASKS.items())
    settings: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    for name, task in TASKS.items():
        if setting := task.setting():
            settings.setdefault(setting, []).append(name)
        if task.requires:
            extras.setdefault(f"{task.requires.replace('_', '-')} (gmpo[{task.extra}])", []).append(
                name
            )
    runs = [f"Without --model, {', '.join(names)}: {s}." for s, names in settings.items()]
    needs = [f"{', '.join(names)} come from {source}." for source, names in extras.items()]
    return " ".join(
        [f"The built-in task, for what --model, --dataset or --reward does not name: {choices}.",
         *runs, *needs]
    )  # fmt: skip


@dataclass
class ScriptArguments:
    """What to train on (the rest is GMPOConfig)."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Local model directory (as save_pretrained writes it) or hub id. "
            "Default: the built-in toy run (a tiny Qwen2-style model on the successor task)."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Dataset hub id, local directory, or .json/.jsonl/.csv/.parquet file with a "
            "'prompt' column. Default: the built-in toy task."
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "Dataset split."})
    task: str = field(
        default=next(iter(TASKS)),
        metadata={"help": _task_help(), "choices": list(TASKS)},
    )
    reward: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Reward function(s) as module:function (the module in the current directory "
            "or on PYTHONPATH). Default: the toy task's."
        },
    )


@dataclass
class CompareArguments(ScriptArguments):
    """``gmpo compare``'s own options."""

    grpo_epsilon: float = field(
        default=0.2,
        metadata={"help": "GRPO's clip epsilon (ratio space: 1 ± epsilon), in (0, 1)."},
    )
    seeds: int = field(
        default=1,
        metadata={"help": "Train each method on this many seeds (seed, seed + 1, ...)."},
    )
    against: str = field(
        default=DEFAULT_AGAINST,
        metadata={
            "help": f"Losses to train beside GMPO, comma-separated: {', '.join(COMPARATORS)}, "
            "each by TRL's GRPOTrainer (settings: docs/losses.md)."
        },
    )
