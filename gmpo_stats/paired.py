"""Paired comparisons of two variants' runs, by rules fixed before any result (docs/study.md).

A *run pair* is the two variants' runs of one seed in one cell (learning rate, gradient clip). A
*seed pair* is the two variants' means over the cells of a seed that both ran: the cells of a
seed share its warm start and its prompts, so its run pairs are not independent of each other,
and the seed is the unit that is.

The sign test of GMPO against another variant: pairs are the two variants' runs with the same
learning rate, gradient clip and seed, pooled over every cell; a pair is a win when GMPO's final
reward is higher, a loss when it is lower, a tie otherwise (dropped). H0: wins and losses are
equally likely; H1 (one-sided): GMPO wins more often. p = P(Binomial(n, 1/2) >= wins).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple


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
    final = {(r["variant"], *cell_of(r), r["seed"]): r["final_reward"] for r in records}
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


def pairs(records: list[dict[str, Any]], a: str, b: str, key: str) -> list[tuple[Any, Any]]:
    """``(a's value, b's value)`` of ``key`` for every seed and cell both methods ran."""
    by = {(r["variant"], *cell_of(r), r["seed"]): r[key] for r in records}
    return [(v, by[(b, lr, clip, seed)]) for (m, lr, clip, seed), v in sorted(by.items(), key=str)
            if m == a and (b, lr, clip, seed) in by]  # fmt: skip


def seed_pairs(
    records: list[dict[str, Any]], a: str, b: str, key: str
) -> list[tuple[float, float]]:
    """``(a's mean, b's mean)`` of ``key`` over the cells of a seed that both methods ran, one
    pair a seed (in seed order). A boolean ``key`` gives the share of those cells' runs with it
    (the fraction of a seed's runs that failed)."""
    by = {(r["variant"], *cell_of(r), r["seed"]): float(r[key]) for r in records}
    out = []
    for seed in sorted({s for (_, _, _, s) in by}):
        cells = [(lr, clip) for (m, lr, clip, s) in by if m == a and s == seed
                 and (b, lr, clip, s) in by]  # fmt: skip
        if cells:
            out.append((statistics.fmean(by[(a, *c, seed)] for c in cells),
                        statistics.fmean(by[(b, *c, seed)] for c in cells)))  # fmt: skip
    return out


def sign(values: list[tuple[float, float]], direction: int = 1) -> dict[str, Any]:
    """Wins (the first value beyond the second in ``direction``), losses, ties, one-sided p."""
    wins = sum(direction * (x - y) > 0 for x, y in values)
    losses = sum(direction * (x - y) < 0 for x, y in values)
    return {"wins": wins, "losses": losses, "ties": len(values) - wins - losses,
            "p": sign_test_p(wins, losses), "p_reverse": sign_test_p(losses, wins)}  # fmt: skip


def mcnemar(values: list[tuple[bool, bool]]) -> dict[str, Any]:
    """Exact one-sided McNemar: of the discordant pairs, those where only the second failed
    (``better``) against those where only the first did; H1: the first fails less often."""
    better = sum((not x) and y for x, y in values)
    worse = sum(x and (not y) for x, y in values)
    return {"better": better, "worse": worse, "p": sign_test_p(better, worse)}


def sign_test_two_sided(wins: int, losses: int) -> float:
    """Two-sided exact sign test: twice the smaller tail of Binomial(wins + losses, 1/2) at
    ``wins``, at most 1 (1 without pairs)."""
    return min(1.0, 2 * min(sign_test_p(wins, losses), sign_test_p(losses, wins)))


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (the units resampled with
    replacement ``resamples`` times, from a generator seeded by ``seed``: the same interval
    every time). NaN for no values."""
    if not values:
        return (math.nan, math.nan)
    import random

    rng = random.Random(seed)
    n = len(values)
    means = sorted(statistics.fmean(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    lo = means[min(resamples - 1, max(0, math.floor(tail * resamples)))]
    hi = means[min(resamples - 1, max(0, math.ceil((1 - tail) * resamples) - 1))]
    return (lo, hi)
