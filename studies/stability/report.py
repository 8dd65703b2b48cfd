"""The stability study's statistics: the collapse rule, the paired sign test, the tables.

The rule and the test are fixed before any result (docs/study.md states them):

* a run's *final reward* is the mean reward of its last ``window`` steps, its *peak reward* the
  largest mean over ``window`` consecutive steps; it *collapsed* when the final reward is at
  least ``drop`` below the peak (``window = 20``, ``drop = 0.3`` in the study);
* sign test of GMPO against a GRPO variant: pairs are the two methods' runs with the same
  learning rate, gradient clip and seed, pooled over every cell; a pair is a win when GMPO's
  final reward is higher, a loss when it is lower, a tie otherwise (dropped). H0: wins and losses
  are equally likely; H1 (one-sided): GMPO wins more often. p = P(Binomial(n, 1/2) >= wins).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

WINDOW = 20
DROP = 0.3
#: the comparisons of the sign test, fixed in advance: (GMPO, GRPO variant)
SIGN_TESTS = (("gmpo", "grpo"), ("gmpo", "grpo_wide"))


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


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test: P(X >= wins) for X ~ Binomial(wins + losses, 1/2)."""
    n = wins + losses
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def cell_of(r: dict[str, Any]) -> tuple[float, float | None]:
    return (r["lr"], r["grad_clip"])


def cell_name(cell: tuple[float, float | None]) -> str:
    lr, clip = cell
    return f"lr {lr:g}, " + ("no grad clip" if clip is None else f"grad clip {clip:g}")


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
    return {cell: Paired(*c) for cell, c in sorted(out.items(), key=lambda kv: _order(kv[0]))}


def pooled(per_cell: dict[Any, Paired]) -> Paired:
    return Paired(*(sum(p[i] for p in per_cell.values()) for i in range(3)))


def _order(cell: tuple[float, float | None]) -> tuple[float, float]:
    return (cell[0], -1.0 if cell[1] is None else cell[1])


def _ms(values: list[float], fmt: str = ".2f") -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):{fmt}} ± {sd:{fmt}}"


def _counts(
    by: dict[Any, list[dict[str, Any]]],
    methods: list[str],
    cells: list[Any],
    counts: Callable[[dict[str, Any]], bool],
) -> list[str]:
    """Table rows: per method and cell, the runs that ``counts`` / runs; then over all cells."""
    lines = []
    for m in methods:
        row, total, n_all = [], 0, 0
        for c in cells:
            runs = by.get((m, *c), [])
            k = sum(counts(r) for r in runs)
            total, n_all = total + k, n_all + len(runs)
            row.append(f"{k}/{len(runs)}" if runs else "—")
        lines.append(f"| {m} | " + " | ".join(row) + f" | {total}/{n_all} |")
    return lines


def tables(records: list[dict[str, Any]], methods: list[str]) -> str:
    """Markdown: collapse counts per method and cell; per method and cell the final reward, peak,
    largest gradient norm, log-ratio range and final entropy; the sign tests."""
    cells = sorted({cell_of(r) for r in records}, key=_order)
    by: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["method"], *cell_of(r)), []).append(r)
    lines = ["", "## Collapsed runs (collapsed / runs)", "",
             "| method | " + " | ".join(cell_name(c) for c in cells) + " | all |",
             "|---|" + "---:|" * (len(cells) + 1)]  # fmt: skip
    lines += _counts(by, methods, cells, lambda r: bool(r["collapsed"]))
    lines += ["", "## Runs that ended below their warm start (final reward < warm-start reward)",
              "", "Descriptive, defined after the first results: a run that falls from the warm "
              "start straight to 0 never has a peak 0.3 above its end, so the collapse rule "
              "above does not count it.", "",
              "| method | " + " | ".join(cell_name(c) for c in cells) + " | all |",
              "|---|" + "---:|" * (len(cells) + 1)]  # fmt: skip
    lines += _counts(by, methods, cells, lambda r: bool(r["final_reward"] < r["start_reward"]))
    lines += ["", "## Per method and cell (mean ± std over seeds; median in brackets)", "",
              "| cell | method | final reward | peak reward | largest grad norm | "
              "log-ratio min | log-ratio max | max abs log-ratio, steps 1-10 | final entropy |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for c in cells:
        for m in methods:
            runs = by.get((m, *c), [])
            if not runs:
                continue
            col = {k: [float(r[k]) for r in runs] for k in runs[0] if isinstance(runs[0][k], float)}
            lines.append(
                f"| {cell_name(c)} | {m} | {_ms(col['final_reward'])} "
                f"[{statistics.median(col['final_reward']):.2f}] | {_ms(col['peak_reward'])} | "
                f"{_ms(col['max_grad_norm'], '.3g')} [{statistics.median(col['max_grad_norm']):.3g}]"
                f" | {_ms(col['log_ratio_min'], '.1f')} | {_ms(col['log_ratio_max'], '.1f')} | "
                f"{_ms(col['log_ratio_absmax_first10'], '.1f')} | {_ms(col['entropy_end'])} |"
            )
    lines += ["", "## Sign tests (fixed in advance; pooled over all cells, paired seeds)", "",
              "H1: GMPO's final reward is higher than the GRPO variant's on the same seed and "
              "cell more often than not. H0: a win and a loss are equally likely. One-sided exact "
              "binomial test on the non-tied pairs; ties (equal final rewards) dropped.", "",
              "| GMPO against | pairs | wins | losses | ties | one-sided p |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    per_cells = {}
    for a, b in SIGN_TESTS:
        per_cell = paired(records, a, b)
        if per_cell:
            per_cells[b] = per_cell
            t = pooled(per_cell)
            n = t.wins + t.losses + t.ties
            lines.append(f"| {b} | {n} | {t.wins} | {t.losses} | {t.ties} | {t.p:.3g} |")
    lines += ["", "Per cell (wins / losses / ties of GMPO):", "",
              "| cell | " + " | ".join(f"against {b}" for b in per_cells) + " |",
              "|---|" + "---:|" * len(per_cells)]  # fmt: skip
    for c in cells:
        cols = [per_cells[b].get(c) for b in per_cells]
        cols_text = [f"{x.wins} / {x.losses} / {x.ties}" if x else "—" for x in cols]
        lines.append(f"| {cell_name(c)} | " + " | ".join(cols_text) + " |")
    return "\n".join(lines) + "\n"
