"""The ``gmpo`` commands: the one list that dispatch, usage and ``--help`` read. A command is a
module with ``main(parsed)`` and a dataclass of its own arguments (:mod:`gmpo_trl.cli.arguments`);
to add one, write the module and add it here."""

from __future__ import annotations

from dataclasses import dataclass

from gmpo_trl.cli.arguments import CompareArguments, ScriptArguments


@dataclass(frozen=True)
class Command:
    """``module``: imported when the command runs (it imports TRL). ``arguments``: its own
    arguments' dataclass. ``description``: the first paragraph of its ``--help``."""

    module: str
    arguments: type
    description: str


COMMANDS: dict[str, Command] = {
    "train": Command(
        "gmpo_trl.cli.train",
        ScriptArguments,
        "Train with GMPO (TRL's GRPOTrainer, gmpo_core's loss).",
    ),
    "compare": Command(
        "gmpo_trl.cli.compare",
        CompareArguments,
        "Train GRPO (TRL, ratio clip 1 ± grpo_epsilon) and GMPO on the same task and seeds; "
        "plot and summarize the token log-ratio range and the reward.",
    ),
}

USAGE = f"usage: gmpo {{{','.join(COMMANDS)}}} [-h] [--help-all] [--model PATH_OR_HUB_ID] [options]"
