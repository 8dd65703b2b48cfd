"""The second study's planned analysis (docs/which_loss_plan.md): GMPO against the losses users
run, each task's grid on fresh seeds, the seed as the unit.

    python -m studies.stability.which_loss runs/which-loss/reverse ... --out results/which-loss

Every rule here is the plan's, fixed before the grid ran:

- a run's outcome is its final reward (the mean of its last 20 steps) and whether it *failed*
  (``gmpo_stats.outcome.failed``: below its warm start at the end, or collapsed);
- the unit is the seed: a seed's value is its mean over the task's rate cells (its two runs share
  a warm start and prompts, so they are not independent); ``gmpo`` against each other variant,
  per task, on the seeds both ran;
- primary: the two-sided exact sign test on the seeds' final rewards, Holm over every task and
  comparator; the effect is the mean of the seeds' differences (GMPO minus the other) with a
  95 % percentile bootstrap interval (10,000 resamples, seed 0) and their median;
- secondary: the same on each seed's share of failed runs (lower is better), Holm apart;
- mechanism, descriptive and tested in the paper's direction (GMPO narrower): the token
  log-ratio spread (q99 - q01) over all steps, Holm over the tasks and comparators; entropy over
  all steps and steps 1-20; where answers vary in length, the completions' length over training;
- what counts against GMPO is reported beside what counts for it, each task apart.

Writes ``which_loss.md`` and ``which_loss.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gmpo_stats.paired import bootstrap_ci, holm, seed_pairs, sign_test_two_sided
from studies.stability.sweep import read_curves

#: the variant every other is compared with
GMPO = "gmpo"
#: the steps at which the completions' mean length is shown
LENGTH_STEPS = (1, 10, 25, 50, 100)


def _fmt(x: float, digits: int = 3) -> str:
    return "—" if x != x else f"{x:.{digits}f}"  # NaN


def _mean_sd(xs: list[float]) -> str:
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {sd:.3f} [{statistics.median(xs):.3f}]"


def compare(records: list[dict[str, Any]], other: str, key: str, sign: int = 1) -> dict[str, Any]:
    """GMPO against ``other`` on ``key`` with the seed as the unit: the seeds' pairs, wins
    (GMPO's value beyond the other's in direction ``sign``), losses, ties, the two-sided p, and
    the mean difference (GMPO minus other) with its bootstrap interval, and the median."""
    pairs = seed_pairs(records, GMPO, other, key)
    diffs = [a - b for a, b in pairs]
    wins = sum(sign * d > 0 for d in diffs)
    losses = sum(sign * d < 0 for d in diffs)
    lo, hi = bootstrap_ci(diffs)
    return {"seeds": len(pairs), "wins": wins, "losses": losses,
            "ties": len(diffs) - wins - losses, "p": sign_test_two_sided(wins, losses),
            "mean_diff": statistics.fmean(diffs) if diffs else float("nan"),
            "ci": [lo, hi], "median_diff": statistics.median(diffs) if diffs else float("nan")}  # fmt: skip


def family(
    by_task: dict[str, list[dict[str, Any]]], key: str, sign: int
) -> dict[str, dict[str, Any]]:
    """:func:`compare` for every task and comparator, with Holm's adjustment over them all."""
    tests: dict[str, dict[str, Any]] = {}
    for task, records in by_task.items():
        for other in sorted({r["variant"] for r in records} - {GMPO}, key=_order(records)):
            tests[f"{task}: {GMPO} vs {other}"] = compare(records, other, key, sign)
    for (name, t), adj in zip(tests.items(), holm([t["p"] for t in tests.values()]), strict=True):
        t["holm"] = adj
        t["name"] = name
    return tests


def _order(records: list[dict[str, Any]]) -> Any:
    first = list(dict.fromkeys(r["variant"] for r in records))
    return first.index


def _test_rows(tests: dict[str, dict[str, Any]], better: str) -> list[str]:
    lines = [f"| test | seeds | GMPO {better} | GMPO worse | ties | mean difference (95 % CI) "
             "| median difference | p (two-sided) | Holm |", "|---|---:|---:|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    for t in tests.values():
        ci = f"[{_fmt(t['ci'][0])}, {_fmt(t['ci'][1])}]"
        lines.append(f"| {t['name']} | {t['seeds']} | {t['wins']} | {t['losses']} | {t['ties']} "
                     f"| {_fmt(t['mean_diff'])} {ci} | {_fmt(t['median_diff'])} "
                     f"| {t['p']:.4f} | {t['holm']:.4f} |")  # fmt: skip
    return lines


def per_cell(records: list[dict[str, Any]]) -> list[str]:
    """Each variant in each rate cell: final reward (mean ± sd [median]) and failed runs."""
    variants = list(dict.fromkeys(r["variant"] for r in records))
    cells = sorted({r["lr"] for r in records})
    lines = ["| variant | " + " | ".join(f"lr {lr:g}: final reward | failed" for lr in cells)
             + " |", "|---|" + "---|---:|" * len(cells)]  # fmt: skip
    for v in variants:
        row = []
        for lr in cells:
            rs = [r for r in records if r["variant"] == v and r["lr"] == lr]
            row += [_mean_sd([r["final_reward"] for r in rs]),
                    f"{sum(r['failed'] for r in rs)}/{len(rs)}"]  # fmt: skip
        lines.append(f"| {v} | " + " | ".join(row) + " |")
    return lines


def mechanism(records: list[dict[str, Any]]) -> list[str]:
    """Per variant: the means over runs of the spread (all steps), entropy (all steps, steps
    1-20) and completion length (all steps)."""
    keys = ("spread_all", "spread_first20", "entropy_all", "entropy_first20", "length_all")
    lines = ["| variant | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for v in dict.fromkeys(r["variant"] for r in records):
        rs = [r for r in records if r["variant"] == v]
        vals = [_fmt(statistics.fmean(r[k] for r in rs)) for k in keys]
        lines.append(f"| {v} | " + " | ".join(vals) + " |")
    return lines


def lengths(sweep: Path, records: list[dict[str, Any]]) -> list[str]:
    """The completions' mean length (valid tokens, end-of-sequence included) at
    :data:`LENGTH_STEPS`, per variant, over its runs of every cell."""
    curves = read_curves(sweep)
    steps = [s for s in LENGTH_STEPS if s <= len(curves[0]["curves"]["length"])]
    lines = ["| variant | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|" + "---:|" * len(steps)]  # fmt: skip
    for v in dict.fromkeys(r["variant"] for r in records):
        cs = [c["curves"]["length"] for c in curves if c["variant"] == v]
        lines.append(f"| {v} | " + " | ".join(
            _fmt(statistics.fmean(c[s - 1] for c in cs), 2) for s in steps) + " |")  # fmt: skip
    return lines


def analyze(sweeps: list[Path]) -> tuple[dict[str, Any], list[str]]:
    """The plan's tests and tables over the sweeps (one a task): ``(json, markdown lines)``."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for d in sweeps:
        records = json.loads((d / "summary.json").read_text())
        by_task[records[0]["task"]] = records
    primary = family(by_task, "final_reward", +1)
    failures = family(by_task, "failed", -1)
    spread = family(by_task, "spread_all", -1)
    out = {"primary": primary, "failures": failures, "spread": spread, "tasks": list(by_task)}
    lines = ["## Primary: final reward, the seed as the unit", "",
             "Each seed's final reward is its mean over the task's rate cells; the difference is "
             "GMPO minus the other. Two-sided exact sign test; Holm over every row.", "",
             *_test_rows(primary, "higher"), "",
             "## Secondary: each seed's share of failed runs", "",
             "A run failed when it ended below its warm start or collapsed. Lower is better; "
             "GMPO 'better' counts the seeds where its share is lower. Holm over every row.", "",
             *_test_rows(failures, "fails less"), "",
             "## Mechanism: the token log-ratio spread over all steps (q99 - q01)", "",
             "The paper's direction: GMPO narrower. Holm over every row.", "",
             *_test_rows(spread, "narrower")]  # fmt: skip
    for task, records in by_task.items():
        lines += ["", f"## {task}", "", "### Each variant, each rate", "", *per_cell(records),
                  "", "### Mechanism (means over runs)", "", *mechanism(records)]  # fmt: skip
        sweep = next(
            d for d in sweeps if json.loads((d / "summary.json").read_text())[0]["task"] == task
        )
        if len({round(r["length_all"], 6) for r in records}) > 1:  # answers vary in length
            lines += ["", "### Completion length over training", "", *lengths(sweep, records)]
    return out, lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.stability.which_loss",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("sweeps", nargs="+", type=Path, help="each task's grid sweep directory")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    out, lines = analyze(args.sweeps)
    head = ["# Which loss? The second study's planned analysis", "",
            f"Command: `python -m studies.stability.which_loss "
            f"{' '.join(map(str, args.sweeps))} --out {args.out}`", ""]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "which_loss.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "which_loss.md").write_text("\n".join(head + lines) + "\n")
    print("\n".join(head + lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
