"""The ``gmpo`` commands: the one list that dispatch, usage and ``--help`` read (TRL's
``trl/cli/commands/__init__.py`` is the model). A command is a
:class:`~gmpo_trl.cli.base.Command`: its module defines it with its arguments and its ``run()``;
to add one, write the module and add it here."""

from __future__ import annotations

from gmpo_trl.cli.base import Command
from gmpo_trl.cli.compare import CompareCommand
from gmpo_trl.cli.train import TrainCommand

COMMANDS: dict[str, Command] = {c.name: c for c in (TrainCommand(), CompareCommand())}

USAGE = f"usage: gmpo {{{','.join(COMMANDS)}}} [-h] [--help-all] [--model PATH_OR_HUB_ID] [options]"
