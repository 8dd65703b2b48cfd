"""Paired comparisons of two methods' runs: by run (seed and cell) or by seed, and their exact
one-sided tests (the sign test, McNemar's on paired failures).

A *run pair* is the two methods' runs of one seed in one cell (learning rate, gradient clip). A
*seed pair* is the two methods' means over the cells of a seed that both ran: the cells of a
seed share its warm start and its prompts, so its run pairs are not independent of each other,
and the seed is the unit that is.
"""

from __future__ import annotations

import statistics
from typing import Any

from gmpo_tasks.rules import cell_of, sign_test_p


def pairs(records: list[dict[str, Any]], a: str, b: str, key: str) -> list[tuple[Any, Any]]:
    """``(a's value, b's value)`` of ``key`` for every seed and cell both methods ran."""
    by = {(r["method"], *cell_of(r), r["seed"]): r[key] for r in records}
    return [(v, by[(b, lr, clip, seed)]) for (m, lr, clip, seed), v in sorted(by.items(), key=str)
            if m == a and (b, lr, clip, seed) in by]  # fmt: skip


def seed_pairs(
    records: list[dict[str, Any]], a: str, b: str, key: str
) -> list[tuple[float, float]]:
    """``(a's mean, b's mean)`` of ``key`` over the cells of a seed that both methods ran, one
    pair a seed (in seed order). A boolean ``key`` gives the share of those cells' runs with it
    (the fraction of a seed's runs that failed)."""
    by = {(r["method"], *cell_of(r), r["seed"]): float(r[key]) for r in records}
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
