"""The built-in tasks: the one list that ``gmpo --task``, its checks and help, and the tests read.

To add a task, write its module (a :class:`gmpo_tasks.task.Task` named ``TASK``) and add it here;
the first entry is the default."""

from __future__ import annotations

from gmpo_tasks import reverse, successor
from gmpo_tasks.task import Task

TASKS: dict[str, Task] = {t.name: t for t in (successor.TASK, reverse.TASK)}


def get_task(name: str) -> Task:
    """The task called ``name``; a ValueError names the choices."""
    if name not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]
