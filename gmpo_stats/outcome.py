"""A run's outcome, by rules fixed before any result (docs/study.md states them), written once:
the stability study's tables and ``gmpo compare``'s summary both read them.

* a run's *final reward* is the mean reward of its last ``window`` steps (logged rewards), its
  *peak reward* the largest mean over ``window`` consecutive steps; it *collapsed* when the final
  reward is at least ``drop`` below the peak (``window = 20``, ``drop = 0.3``);
* a run *failed* (the confirmatory study's primary count, docs/study_plan.md) when its final
  reward is below its warm start's reward or it collapsed (which sees the runs that fall from
  the warm start straight to 0 as well as those that learn and lose it).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple

#: the collapse rule's window (logged rewards) and drop
WINDOW = 20
DROP = 0.3


class Collapse(NamedTuple):
    final: float
    peak: float
    collapsed: bool


def collapse(rewards: Sequence[float], window: int = WINDOW, drop: float = DROP) -> Collapse:
    """Final and peak ``window``-step mean reward of a reward curve and whether it collapsed.
    A curve shorter than ``window`` uses its whole length as the window."""
    if not rewards:
        raise ValueError("collapse: empty reward curve")
    w = min(window, len(rewards))
    means = [statistics.fmean(rewards[i : i + w]) for i in range(len(rewards) - w + 1)]
    final, peak = means[-1], max(means)
    return Collapse(final, peak, peak - final >= drop - 1e-12)


def failed(
    rewards: Sequence[float], start: float, window: int = WINDOW, drop: float = DROP
) -> bool:
    """Whether a run failed: its final reward below ``start`` (the warm start's reward), or at
    least ``drop`` below its peak (:func:`collapse`)."""
    c = collapse(rewards, window, drop)
    return c.final < start or c.collapsed
