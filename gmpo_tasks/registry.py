"""The tasks: the one list that ``gmpo --task``, its checks and help, the stability study and the
tests read.

To add a task, write its module (a :class:`gmpo_tasks.task.Task` subclass and its instance
``TASK``) and add one line here; the first entry is ``gmpo``'s default."""

from __future__ import annotations

from gmpo_tasks import add, chain_sum, countdown, reverse, spell_backward, successor
from gmpo_tasks.task import Task

#: the reasoning-gym tasks (chain_sum, countdown, spell_backward) need the gym extra
_ALL = (successor.TASK, reverse.TASK, add.TASK, chain_sum.TASK, countdown.TASK, spell_backward.TASK)
TASKS: dict[str, Task] = {t.name: t for t in _ALL}


def get_task(name: object) -> Task:
    """The task called ``name``; a ValueError names the choices."""
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]
