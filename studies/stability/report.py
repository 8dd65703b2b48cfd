"""The stability study's tables: collapse counts, per-cell statistics and the sign tests, by the
rules of :mod:`gmpo_stats` (fixed in advance; docs/study.md states them)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from gmpo_stats.paired import cell_of, cell_order, paired, pooled

#: the comparisons of the sign test, fixed in advance: (GMPO, GRPO variant)
SIGN_TESTS = (("gmpo", "grpo"), ("gmpo", "grpo_wide"))


def cell_name(cell: tuple[float, float | None]) -> str:
    lr, clip = cell
    return f"lr {lr:g}, " + ("no grad clip" if clip is None else f"grad clip {clip:g}")


def _ms(values: list[float], fmt: str = ".2f") -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):{fmt}} ± {sd:{fmt}}"


def _counts(
    by: dict[Any, list[dict[str, Any]]],
    variants: list[str],
    cells: list[Any],
    counts: Callable[[dict[str, Any]], bool],
) -> list[str]:
    """Table rows: per method and cell, the runs that ``counts`` / runs; then over all cells."""
    lines = []
    for m in variants:
        row, total, n_all = [], 0, 0
        for c in cells:
            runs = by.get((m, *c), [])
            k = sum(counts(r) for r in runs)
            total, n_all = total + k, n_all + len(runs)
            row.append(f"{k}/{len(runs)}" if runs else "—")
        lines.append(f"| {m} | " + " | ".join(row) + f" | {total}/{n_all} |")
    return lines


def tables(records: list[dict[str, Any]], variants: list[str]) -> str:
    """Markdown: collapse counts per method and cell; per method and cell the final reward, peak,
    largest gradient norm, log-ratio range and final entropy; the sign tests."""
    cells = sorted({cell_of(r) for r in records}, key=cell_order)
    by: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["variant"], *cell_of(r)), []).append(r)
    lines = ["", "## Collapsed runs (collapsed / runs)", "",
             "| method | " + " | ".join(cell_name(c) for c in cells) + " | all |",
             "|---|" + "---:|" * (len(cells) + 1)]  # fmt: skip
    lines += _counts(by, variants, cells, lambda r: bool(r["collapsed"]))
    lines += ["", "## Runs that ended below their warm start (final reward < warm-start reward)",
              "", "Descriptive, defined after the first results: a run that falls from the warm "
              "start straight to 0 never has a peak 0.3 above its end, so the collapse rule "
              "above does not count it.", "",
              "| method | " + " | ".join(cell_name(c) for c in cells) + " | all |",
              "|---|" + "---:|" * (len(cells) + 1)]  # fmt: skip
    lines += _counts(by, variants, cells, lambda r: bool(r["final_reward"] < r["start_reward"]))
    lines += ["", "## Per method and cell (mean ± std over seeds; median in brackets)", "",
              "| cell | method | final reward | peak reward | largest grad norm | "
              "log-ratio min | log-ratio max | max abs log-ratio, steps 1-10 | final entropy |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for c in cells:
        for m in variants:
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
