"""The tasks: the one list that ``gmpo --task``, its checks and help, the stability study and the
tests read.

To add a task, write its module (a :class:`gmpo_tasks.task.Task` subclass and its instance
``TASK``) and add one line here; the first entry is ``gmpo``'s default."""

from __future__ import annotations

import importlib.util

from gmpo_tasks import (
    add,
    chain_sum,
    chat_arith,
    chat_chain_sum,
    chat_spell_backward,
    countdown,
    reverse,
    spell_backward,
    successor,
)
from gmpo_tasks.task import Task

#: the reasoning-gym tasks (chain_sum, countdown, spell_backward) need the gym extra
_ALL = (successor.TASK, reverse.TASK, add.TASK, chain_sum.TASK, countdown.TASK, spell_backward.TASK,
        chat_chain_sum.TASK, chat_spell_backward.TASK, chat_arith.TASK)  # fmt: skip
TASKS: dict[str, Task] = {t.name: t for t in _ALL}
#: the tasks of a built-in tiny model (the stability study's); the others train a pretrained
#: chat model (``Task.model_name``)
TINY_TASKS: dict[str, Task] = {n: t for n, t in TASKS.items() if t.model_name is None}


def get_task(name: object) -> Task:
    """The task called ``name``, its extra installed; a ValueError of one line names the choices
    or the extra to install."""
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {name!r}")
    check_available(TASKS[name])
    return TASKS[name]


def check_available(task: Task) -> None:
    """A ValueError of one line naming the extra to install where ``task.requires`` is not
    importable (found without importing it)."""
    if task.requires is None or importlib.util.find_spec(task.requires) is not None:
        return
    raise ValueError(
        f"the {task.name} task needs {task.requires.replace('_', '-')}, which is not "
        f"installed: pip install -e '.[{task.extra or task.requires}]' in the gmpo clone"
    )
