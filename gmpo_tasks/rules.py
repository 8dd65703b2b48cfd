"""The study's rules, fixed before any result (docs/study.md states them), written once: the
stability study's tables and ``gmpo compare``'s summary both read them.

* a run's *final reward* is the mean reward of its last ``window`` steps (logged rewards), its
  *peak reward* the largest mean over ``window`` consecutive steps; it *collapsed* when the final
  reward is at least ``drop`` below the peak (``window = 20``, ``drop = 0.3``);
* a run *failed* (the confirmatory study's primary count, docs/study_plan.md) when its final
  reward is below its warm start's reward or it collapsed (which sees the runs that fall from
  the warm start straight to 0 as well as those that learn and lose it);
* sign test of GMPO against a GRPO variant: pairs are the two methods' runs with the same
  learning rate, gradient clip and seed, pooled over every cell; a pair is a win when GMPO's
  final reward is higher, a loss when it is lower, a tie otherwise (dropped). H0: wins and losses
  are equally likely; H1 (one-sided): GMPO wins more often. p = P(Binomial(n, 1/2) >= wins).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

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


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the k-th smallest p times
    (m - k + 1), made monotone, at most 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [0.0] * len(ps)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test: P(X >= wins) for X ~ Binomial(wins + losses, 1/2)."""
    n = wins + losses
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def cell_of(r: dict[str, Any]) -> tuple[float, float | None]:
    """A run record's cell: (learning rate, gradient clip)."""
    return (r["lr"], r["grad_clip"])


class Paired(NamedTuple):
    wins: int
    losses: int
    ties: int

    @property
    def p(self) -> float:
        return sign_test_p(self.wins, self.losses)


def paired(records: Iterable[dict[str, Any]], a: str, b: str) -> dict[Any, Paired]:
    """Per cell, ``a`` against ``b`` on the same seed (final reward): wins, losses, ties of ``a``."""
    final = {(r["method"], *cell_of(r), r["seed"]): r["final_reward"] for r in records}
    out: dict[Any, list[int]] = {}
    for (method, lr, clip, seed), fa in final.items():
        fb = final.get((b, lr, clip, seed))
        if method != a or fb is None:
            continue
        counts = out.setdefault((lr, clip), [0, 0, 0])
        counts[0 if fa > fb else 1 if fa < fb else 2] += 1
    return {cell: Paired(*c) for cell, c in sorted(out.items(), key=lambda kv: cell_order(kv[0]))}


def pooled(per_cell: dict[Any, Paired]) -> Paired:
    return Paired(*(sum(p[i] for p in per_cell.values()) for i in range(3)))


def cell_order(cell: tuple[float, float | None]) -> tuple[float, float]:
    return (cell[0], -1.0 if cell[1] is None else cell[1])
