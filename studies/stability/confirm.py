"""The confirmatory analysis of docs/study_plan.md, on the sweeps' summary.json files.

    python -m studies.stability.confirm results/study-confirm/reverse \\
        results/study-confirm/add --out results/study-confirm

Every rule here is the plan's, fixed before the runs: the primary endpoint (final reward, the
mean of the last 20 steps), the exact one-sided sign test over the pairs of a task (both cells
pooled), the three comparisons, Holm over the six tests; the failure counts (the primary rule
``gmpo_stats.failed`` and the old collapse rule) with an exact one-sided McNemar test,
Holm over its six; the mechanism metrics over steps 1-20 with their sign tests in the paper's
direction, Holm over eight; and what counts against GMPO. Writes ``confirm.json`` and
``confirm.md``, and in both, apart, the tables the plan did not fix
(:mod:`studies.stability.unplanned`: the scope, the seed as the unit, each cell alone, the
mechanism's tests over all steps, the warm starts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gmpo_stats.paired import cell_of, holm, mcnemar, pairs, sign
from studies.stability import unplanned

#: (name, first method, second method): the first is expected higher
COMPARISONS = (("C1", "gmpo", "grpo"), ("C2", "gmpo", "grpo_wide"), ("C3", "gmpo_narrow", "grpo"))
METHODS = ("grpo", "grpo_wide", "gmpo", "gmpo_narrow")
#: the mechanism's sign tests: metric, the direction the paper predicts for the first method
#: (+1 higher, -1 lower), the comparisons it is tested in
MECHANISM_TESTS = (("spread", -1), ("entropy", 1))
MECHANISM_COMPARISONS = ("C1", "C2")
ALPHA = 0.05
FIRST = 20


def _ms(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]  # NaN: a method without token clip bounds
    if not xs:
        return "—"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def analyse(records: list[dict[str, Any]]) -> dict[str, Any]:
    tasks = sorted({r["task"] for r in records}, key=lambda t: (t != "reverse", t))
    out: dict[str, Any] = {"tasks": tasks, "primary": [], "failures": [], "mechanism": []}
    for task in tasks:
        rs = [r for r in records if r["task"] == task]
        for name, a, b in COMPARISONS:
            out["primary"].append({"task": task, "comparison": name, "a": a, "b": b,
                                   **sign(pairs(rs, a, b, "final_reward"))})  # fmt: skip
            out["failures"].append({"task": task, "comparison": name, "a": a, "b": b,
                                    **mcnemar(pairs(rs, a, b, "failed"))})  # fmt: skip
        for name, a, b in COMPARISONS:
            if name not in MECHANISM_COMPARISONS:
                continue
            for metric, direction in MECHANISM_TESTS:
                key = f"{metric}_first{FIRST}"
                out["mechanism"].append({"task": task, "comparison": name, "a": a, "b": b,
                                         "metric": metric, "direction": direction,
                                         **sign(pairs(rs, a, b, key), direction)})  # fmt: skip
    for family in ("primary", "failures", "mechanism"):
        for row, adj in zip(out[family], holm([r["p"] for r in out[family]]), strict=True):
            row["p_holm"] = adj
            row["confirmed"] = adj < ALPHA
    out["verdicts"] = verdicts(out, records, tasks)
    return out


def verdicts(out: dict[str, Any], records: list[dict[str, Any]], tasks: list[str]) -> list[str]:
    """The plan's conclusions and each of its "counts against GMPO" that occurred."""
    lines = []
    for name, a, b in COMPARISONS:
        rows = [r for r in out["primary"] if r["comparison"] == name]
        on = [r["task"] for r in rows if r["confirmed"]]
        state = (
            "confirmed"
            if len(on) == len(tasks)
            else f"confirmed on {on}"
            if on
            else "not confirmed"
        )
        lines.append(f"{name} ({a} > {b}): {state}")
    c1 = [r for r in out["primary"] if r["comparison"] == "C1"]
    if not any(r["confirmed"] for r in c1):
        lines.append("against GMPO: C1 is confirmed on neither task")
    for r in c1:
        if r["losses"] > r["wins"]:
            lines.append(f"against GMPO: more losses than wins in C1 on {r['task']}")
    for r in out["primary"]:
        if r["comparison"] in ("C1", "C2") and r["p_reverse"] < ALPHA:
            lines.append(f"against GMPO: {r['b']} higher than {r['a']} on {r['task']} "
                         f"(one-sided p = {r['p_reverse']:.4f})")  # fmt: skip
    more = [t for t in tasks
            if sum(r["failed"] for r in records if r["task"] == t and r["variant"] == "gmpo")
            > sum(r["failed"] for r in records if r["task"] == t and r["variant"] == "grpo")]  # fmt: skip
    if more and len(more) == len(tasks):
        lines.append("against GMPO: gmpo failed in more runs than grpo on every task")
    for metric, _ in MECHANISM_TESTS:
        rows = [r for r in out["mechanism"] if r["comparison"] == "C1" and r["metric"] == metric]
        if not any(r["confirmed"] for r in rows):
            lines.append(f"against GMPO's mechanism: the {metric} in the paper's direction is "
                         "confirmed on neither task in C1")  # fmt: skip
    return lines


def report(out: dict[str, Any], records: list[dict[str, Any]], command: str) -> str:
    lines = ["# The confirmatory study: results", "", f"Command: `{command}`", "",
             "Analysis as planned in docs/study_plan.md; nothing before the last section "
             "(\"Beside the plan\") was chosen after the runs.",
             "", "## Primary: final reward, sign tests (both cells of a task pooled)", "",
             "| task | comparison | wins | losses | ties | p (one-sided) | p (Holm, 6) | confirmed |",
             "|---|---|---:|---:|---:|---:|---:|---|",
             *(f"| {r['task']} | {r['comparison']} {r['a']} > {r['b']} | {r['wins']} | "
               f"{r['losses']} | {r['ties']} | {r['p']:.4f} | {r['p_holm']:.4f} | "
               f"{'yes' if r['confirmed'] else 'no'} |" for r in out["primary"]),
             "", "## Verdicts", "", *(f"- {v}" for v in out["verdicts"]), "",
             "## Per method and cell", "",
             "| task | lr | grad clip | method | runs | warm start | final reward | peak reward "
             "| failed | collapsed (old rule) |", "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    cells = sorted({(r["task"], *cell_of(r)) for r in records},
                   key=lambda c: (c[0] != "reverse", c[0], c[1], -1 if c[2] is None else c[2]))  # fmt: skip
    for task, lr, clip in cells:
        for m in METHODS:
            rs = [
                r
                for r in records
                if (r["task"], *cell_of(r)) == (task, lr, clip) and r["variant"] == m
            ]
            if not rs:
                continue
            lines.append(f"| {task} | {lr:g} | {clip if clip is not None else 'none'} | {m} | "
                         f"{len(rs)} | {_ms([r['start_reward'] for r in rs])} | "
                         f"{_ms([r['final_reward'] for r in rs])} | {_ms([r['peak_reward'] for r in rs])} | "
                         f"{sum(r['failed'] for r in rs)}/{len(rs)} | "
                         f"{sum(r['collapsed'] for r in rs)}/{len(rs)} |")  # fmt: skip
    lines += ["", "## Secondary: failures, exact one-sided McNemar (Holm over 6)", "",
              "| task | comparison | only the second failed | only the first failed | p | p (Holm) |",
              "|---|---|---:|---:|---:|---:|",
              *(f"| {r['task']} | {r['comparison']} {r['a']} vs {r['b']} | {r['better']} | "
                f"{r['worse']} | {r['p']:.4f} | {r['p_holm']:.4f} |" for r in out["failures"]),
              "", f"## Secondary: mechanism, steps 1-{FIRST}, sign tests in the paper's direction "
              "(Holm over 8)", "",
              "| task | comparison | metric | predicted for the first | wins | losses | ties | p | p (Holm) |",
              "|---|---|---|---|---:|---:|---:|---:|---:|",
              *(f"| {r['task']} | {r['comparison']} {r['a']} vs {r['b']} | {r['metric']} | "
                f"{'lower' if r['direction'] < 0 else 'higher'} | {r['wins']} | {r['losses']} | "
                f"{r['ties']} | {r['p']:.4f} | {r['p_holm']:.4f} |" for r in out["mechanism"]),
              "", "## Mechanism metrics per method (mean ± std over runs)", ""]  # fmt: skip
    metrics = (
        "q01",
        "q05",
        "q95",
        "q99",
        "spread",
        "seq_range",
        "clip_low",
        "clip_high",
        "entropy",
    )
    for span in (f"first{FIRST}", "all"):
        lines += [f"Over {'steps 1-' + str(FIRST) if span != 'all' else 'all steps'}:", "",
                  "| task | lr | grad clip | method | " + " | ".join(metrics) + " |",
                  "|---|---:|---|---|" + "---:|" * len(metrics)]  # fmt: skip
        for task, lr, clip in cells:
            for m in METHODS:
                rs = [
                    r
                    for r in records
                    if (r["task"], *cell_of(r)) == (task, lr, clip) and r["variant"] == m
                ]
                if rs:
                    lines.append(f"| {task} | {lr:g} | {clip if clip is not None else 'none'} | {m} | "
                                 + " | ".join(_ms([r[f"{k}_{span}"] for r in rs]) for k in metrics) + " |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="sweep output directories (summary.json)")
    p.add_argument("--out", type=Path, default=Path("runs/study-confirm"))
    args = p.parse_args(argv)
    records = [r for d in args.runs for r in json.loads((d / "summary.json").read_text())
               if r["variant"] in METHODS]  # fmt: skip
    out = analyse(records)
    out["unplanned"] = unplanned.analyse(records, COMPARISONS, MECHANISM_TESTS,
                                         MECHANISM_COMPARISONS)  # fmt: skip
    scopes = [unplanned.scope(s) for s in unplanned.setups(args.runs).values()]
    out["unplanned"]["scope"] = scopes
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m studies.stability.confirm", *argv])
    (args.out / "confirm.json").write_text(json.dumps(out, indent=1) + "\n")
    text = report(out, records, command).rstrip("\n").split("\n")
    (args.out / "confirm.md").write_text(
        "\n".join(text + unplanned.report(out["unplanned"], scopes))
    )
    print("\n".join(out["verdicts"]))
    print(f"{len(records)} runs; {args.out}/confirm.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
