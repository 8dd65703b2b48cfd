"""What a run is summarized by, as pure functions of its logged rows (``metrics.jsonl``): the
token log-ratio range of the off-policy steps, the reward at the start and the end, the clip
fractions; one run's summary, its outcome under ``gmpo_stats.outcome``'s rules, and ``gmpo
compare``'s tables over methods and seeds (each method against GMPO with ``gmpo_stats.paired``'s
sign test)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from gmpo_stats.outcome import WINDOW, collapse, failed
from gmpo_stats.paired import sign_test_p


def has_range(row: dict[str, Any]) -> bool:
    """Whether a logged row's token log-ratio range means something: an on-policy step
    (the first pass over a fresh generation) has r = logp - old_logp = 0 on every token."""
    lo, hi = row.get("log_ratio/min"), row.get("log_ratio/max")
    if not (isinstance(lo, int | float) and isinstance(hi, int | float)):
        return False
    return math.isfinite(lo) and math.isfinite(hi) and (lo != 0.0 or hi != 0.0)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-step records of a metrics.jsonl (the final summary record excluded)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward" in r or "log_ratio/min" in r]


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    if key.startswith("log_ratio/"):
        rows = [r for r in rows if has_range(r)]
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
    pts = [(s, v) for s, v in pts if math.isfinite(v)]
    return [s for s, _ in pts], [v for _, v in pts]


#: what a run's first and final reward are, named once: every summary line and table reads
#: them from :func:`outcome`, which takes them from ``gmpo_stats.outcome``
REWARDS = (
    "First reward: a run's first logged reward (its first generation, sampled before any "
    f"update); final reward: the mean of its last {WINDOW} logged rewards, all of them when "
    "fewer (gmpo_stats.outcome's; wins and failed runs against GMPO are counted from it too). A "
    "reward is logged per generation, every num_iterations x steps_per_generation optimizer "
    "steps."
)


#: a run's collapse (``gmpo_stats.collapse``, docs/study.md's rule) is shown only for runs
#: with at least this many logged rewards (one per generation)
JUDGED_FROM = 2 * WINDOW


def run_summary(rows: list[dict[str, Any]], global_step: int) -> dict[str, Any]:
    """The numbers a run is summarized by (``summary.json``): its first and final reward are
    :func:`outcome`'s (``reward_window``: how many logged rewards the final one averages)."""
    _, reward = series(rows, "reward")
    ranged = [r for r in rows if has_range(r)]
    out: dict[str, Any] = {
        "optimizer_steps": global_step,
        "logged_rows": len(rows),
        "off_policy_rows": len(ranged),
    }
    if reward:
        run = outcome(rows)
        out.update(reward_first=run["reward_start"], reward_final=run["final"],
                   reward_window=min(WINDOW, len(reward)))  # fmt: skip
        if len(reward) >= JUDGED_FROM:
            out.update(reward_peak20=run["peak"], collapsed=run["collapsed"])
    if ranged:
        lo = [r["log_ratio/min"] for r in ranged]
        hi = [r["log_ratio/max"] for r in ranged]
        out.update(
            log_ratio_min=min(lo),
            log_ratio_max=max(hi),
            log_ratio_width_mean=statistics.fmean(h - m for m, h in zip(lo, hi, strict=True)),
        )
    clips = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
    for key in (*clips, "variant/clip_ratio"):  # the last: a loss variant's (loss_variant)
        _, v = series(rows, key)
        if v:
            out[key.replace("/", "_") + "_max"] = max(v)
    return out


def summary_line(what: str, s: dict[str, Any]) -> str:
    parts = [f"{what}: {s['optimizer_steps']} optimizer steps ({s['logged_rows']} logged)"]
    if "reward_first" in s:
        parts.append(f"reward {s['reward_first']:.2f} -> {s['reward_final']:.2f} (the first "
                     "logged reward, then the final reward: the mean of the last "
                     f"{s['reward_window']} logged)")  # fmt: skip
    if "held_out_reward_before" in s:
        parts.append(f"held-out reward {s['held_out_reward_before']:.2f} -> "
                     f"{s['held_out_reward_after']:.2f} ({s['held_out_completions']} completions; "
                     f"right {s['held_out_right_before']:.2f} -> {s['held_out_right_after']:.2f})")  # fmt: skip
    if "log_ratio_min" in s:
        parts.append(f"token log-ratio range [{s['log_ratio_min']:.2f}, {s['log_ratio_max']:.2f}]"
                     f" over {s['off_policy_rows']} off-policy logged steps")  # fmt: skip
    return "; ".join(parts)


def summary_markdown(s: dict[str, Any], line: str) -> str:
    """``summary.md``: the summary line, then the summary as a table."""
    rows = [
        f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in s.items()
    ]
    table = "\n".join(["| quantity | value |", "|---|---:|", *rows])
    return f"{line}\n\n{table}\n"


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


COMPARE_COLUMNS = (
    ("reward_first", "first reward"),
    ("reward_final", "final reward"),
    ("reward_peak20", "peak (20)"),
    ("collapsed", "collapsed"),
    ("log_ratio_min", "log-ratio min"),
    ("log_ratio_max", "log-ratio max"),
    ("log_ratio_width_mean", "mean step width"),
    ("clip_ratio_region_mean_max", "max clipped fraction"),
    ("variant_clip_ratio_max", "max clipped fraction (variant)"),
)


def _cell(value: Any) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else f"{value:.2f}"


def compare_table(per_seed: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """Markdown: per method, mean ± std over seeds of each summary number (collapsed: the count
    of runs); then every seed. A column no run has is left out."""
    agg: dict[str, Any] = {}
    runs = [s for summaries in per_seed.values() for s in summaries]
    columns = [(k, t) for k, t in COMPARE_COLUMNS if any(k in s for s in runs)]
    head = "| method | seeds | " + " | ".join(t for _, t in columns) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(columns)]
    for name, summaries in per_seed.items():
        agg[name] = {}
        cells = []
        for key, _ in columns:
            vals = [s[key] for s in summaries if key in s]
            if len(vals) != len(summaries) or not vals:
                cells.append("—")
            elif key == "collapsed":
                agg[name][key] = {"count": sum(vals), "values": vals}
                cells.append(f"{sum(vals)}/{len(vals)}")
            else:
                m, sd = mean_std(vals)
                agg[name][key] = {"mean": m, "std": sd, "values": vals}
                cells.append(f"{m:.2f} ± {sd:.2f}")
        lines.append(f"| {name} | {len(summaries)} | " + " | ".join(cells) + " |")
    lines += ["", "| method | seed | " + " | ".join(t for _, t in columns) + " |",
              "|---|---:|" + "---:|" * len(columns)]  # fmt: skip
    for name, summaries in per_seed.items():
        for s in summaries:
            cells = [_cell(s[k]) if k in s else "—" for k, _ in columns]
            lines.append(f"| {name} | {s['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines), agg


def outcome(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's outcome under ``gmpo_stats.outcome``'s rules (:data:`REWARDS`): its warm start's
    reward (the first logged reward: the first generation is sampled before any update), its
    final reward (the mean of the last ``WINDOW`` logged rewards, all of them when fewer), its
    peak (the largest mean of ``WINDOW`` consecutive ones), whether it collapsed, and whether it
    failed (final below the warm start's reward, or collapsed); empty without a logged
    reward."""
    _, rewards = series(rows, "reward")
    if not rewards:
        return {}
    start, col = rewards[0], collapse(rewards)
    return {"reward_start": start, "final": col.final, "peak": col.peak,
            "collapsed": col.collapsed, "failed": failed(rewards, start)}  # fmt: skip


def against_table(
    per_seed: dict[str, list[dict[str, Any]]], reference: str = "GMPO"
) -> tuple[str, dict[str, Any]]:
    """Markdown: per method (rows of :func:`outcome` with their ``seed``), the mean final reward
    ± sample std over seeds, ``reference``'s wins, losses and ties against it on the same seeds
    with the one-sided sign test's p (H1: ``reference`` wins more often), and its failed runs."""
    final = {name: {r["seed"]: r["final"] for r in rows if "final" in r}
             for name, rows in per_seed.items()}  # fmt: skip
    lines = [
        f"| method | seeds | final reward | {reference} wins | {reference} losses | ties | "
        "p (sign test, one-sided) | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    agg: dict[str, Any] = {}
    for name, rows in per_seed.items():
        values = list(final[name].values())
        m, sd = mean_std(values) if values else (math.nan, math.nan)
        fails = sum(bool(r.get("failed")) for r in rows)
        entry: dict[str, Any] = {"final": {"mean": m, "std": sd, "values": values},
                                 "failed": fails, "runs": len(rows)}  # fmt: skip
        cells = [f"{m:.2f} ± {sd:.2f}" if values else "—"]
        if name == reference:
            cells += ["—"] * 4
        else:
            pairs = [(final[reference][s], v) for s, v in final[name].items()
                     if s in final[reference]]  # fmt: skip
            wins = sum(g > v for g, v in pairs)
            losses = sum(g < v for g, v in pairs)
            p = sign_test_p(wins, losses)
            entry.update(wins=wins, losses=losses, ties=len(pairs) - wins - losses, p=p)
            cells += [str(wins), str(losses), str(len(pairs) - wins - losses), f"{p:.3g}"]
        agg[name] = entry
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + f" | {fails}/{len(rows)} |")
    return "\n".join(lines), agg
