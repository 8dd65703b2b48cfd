"""What a ``gmpo`` command is (after TRL's ``trl/cli/commands/base.py``): one object with its
name, its ``--help`` description, its own arguments' dataclass (:mod:`gmpo_trl.cli.arguments`,
which the parser reads beside ``GMPOConfig``) and its ``run()``, which takes the parsed command
line. :data:`gmpo_trl.cli.commands.COMMANDS` lists the commands."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from gmpo_trl.cli.runs import Parsed


class Command:
    """A ``gmpo`` command. Its ``run`` imports TRL (seconds); its module imports nothing heavy,
    so that dispatch and ``--help`` stay fast."""

    name: ClassVar[str]
    description: ClassVar[str]
    arguments: ClassVar[type]

    def run(self, parsed: Parsed) -> Path:
        """Run the command; returns its output directory. A user error is a
        :class:`~gmpo_trl.cli.errors.CLIError` (one line, exit status 2)."""
        raise NotImplementedError
