"""The regime study's timing (docs/regime_plan.md, the budget): one run per task and regime
before the plan, and the estimate of each part's wall-clock from it and from the second study's
measured throughput (``python -m studies.stability.updates timing``)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from studies.stability.sweep import invocations
from studies.stability.updates_plan import (
    BUDGET_H,
    EXTEND,
    EXTRA_TASK,
    GRID_SEEDS,
    LADDER,
    LOSSES,
    PILOT_SEEDS,
    REGIMES,
    TASKS,
    TIMING,
    records_of,
    regime_name,
    run_sweep,
    sweep_argv,
)
from studies.stability.which_loss import GMPO


def timing(args: argparse.Namespace) -> int:
    """One run of :data:`TIMING`'s loss, rate and seed per task and regime, with one worker:
    its CPU seconds and its warm start's, into ``timing.md`` and ``timing.json``; beside them,
    each loss's CPU time relative to ``gmpo``'s in the second study's grid (16 updates)."""
    cell = [(TIMING["loss"], TIMING["lr"])]
    for task in (*TASKS, EXTRA_TASK):
        for u in REGIMES:
            out = args.runs / "timing" / task / regime_name(u)
            run_sweep(
                [*sweep_argv(task, u, cell, (TIMING["seed"],), out, 1), "--fresh"], args.dry_run
            )
    return 0 if args.dry_run else timing_report(args.runs / "timing", args.results)


def timing_report(runs: Path, results: Path) -> int:
    """:func:`timing`'s tables from its runs under ``runs``, into ``results``."""
    rows = []
    for task in (*TASKS, EXTRA_TASK):
        for u in REGIMES:
            out = runs / task / regime_name(u)
            (r,) = records_of(out)
            inv = invocations(out)[-1]
            rows.append({"task": task, "updates": u, "run_cpu_s": r["cpu_s"],
                         "warm_cpu_s": inv["cpu_s"] - r["cpu_s"], "wall_s": inv["wall_s"],
                         "load_start": inv["load_start"], "final_reward": r["final_reward"],
                         "start_reward": r["start_reward"]})  # fmt: skip
    ratios = loss_cost(Path("results/which-loss"))
    rate = throughput(Path("results/which-loss"))
    plan = estimate(rows, ratios, rate)
    results.mkdir(parents=True, exist_ok=True)
    (results / "timing.json").write_text(
        json.dumps({"runs": rows, "loss_cost": ratios, "throughput": rate, "estimate": plan},
                   indent=1) + "\n"
    )  # fmt: skip
    lines = ["# The regime study's timing: one run per task and regime", "",
             f"Command: `python -m studies.stability.updates timing`: `{TIMING['loss']}` at lr "
             f"{TIMING['lr']:g}, seed {TIMING['seed']}, one worker; CPU seconds of the run and "
             "of its warm start (the sweep's process time), the invocation's wall-clock.", "",
             "| task | updates | run CPU s | warm start CPU s | wall-clock s | load average at "
             "the start | final reward | warm start reward |",
             "|---|---:|---:|---:|---:|---:|---:|---:|",
             *(f"| {x['task']} | {x['updates']} | {x['run_cpu_s']:.1f} | {x['warm_cpu_s']:.1f} | "
               f"{x['wall_s']:.0f} | {x['load_start']:.2f} | {x['final_reward']:.3f} | "
               f"{x['start_reward']:.3f} |" for x in rows), "",
             "Each loss's mean CPU time per run relative to `gmpo`'s, in the second study's grid "
             "(16 updates; `results/which-loss/<task>/summary.json`):", "",
             "| task | " + " | ".join(next(iter(ratios.values()))) + " |",
             "|---|" + "---:|" * len(next(iter(ratios.values()))),
             *(f"| {t} | " + " | ".join(f"{x:.2f}" for x in d.values()) + " |"
               for t, d in ratios.items()), "",
             f"The second study's grid computed {rate['runs']:.0f} runs, "
             f"{rate['cpu_s']:.0f} s of CPU, in {rate['wall_s']:.0f} s "
             f"({rate['wall_s'] / 3600:.2f} h) of wall-clock on two workers "
             f"(its {rate['invocations']:.0f} invocations, `results/which-loss/*/invocations.jsonl`): "
             f"{rate['cpu_per_wall']:.2f} CPU seconds a second.", "",
             "## The estimate", "",
             "Each step's runs at each task's and regime's CPU time per run above, times the mean "
             "of the losses' relative cost (`dapo_trl` and `cispo_trl` at `grpo`'s), plus one "
             "warm start a seed and task (the regimes share it); wall-clock at the second "
             "study's CPU seconds a second. The pilot's extension at most: every loss at "
             f"{EXTEND} more rates in every regime; the grid with the sanity cell at 1 update "
             "(grpo at gmpo's rate on every seed).", "",
             "| step | task | runs | CPU h | wall-clock h |", "|---|---|---:|---:|---:|",
             *(f"| {e['step']} | {e['task']} | {e['runs']} | {e['cpu_s'] / 3600:.2f} | "
               f"{e['wall_s'] / 3600:.2f} |" for e in plan), "",
             "In the plan's order (docs/regime_plan.md, the budget), cumulative:", "",
             "| part | runs | wall-clock h | cumulative wall-clock h |", "|---|---:|---:|---:|",
             *order_rows(plan)]  # fmt: skip
    (results / "timing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


#: the study's parts in the order they run (and the reverse of the order they are dropped in)
ORDER = (("the primary tasks' pilot and grid", TASKS, ("pilot", "pilot extension, at most", "grid")),
         ("the primary tasks' robustness cells", TASKS, ("robustness",)),
         (f"{EXTRA_TASK}'s pilot and grid", (EXTRA_TASK,), ("pilot", "pilot extension, at most", "grid")),
         (f"{EXTRA_TASK}'s robustness cells", (EXTRA_TASK,), ("robustness",)))  # fmt: skip


def parts(plan: list[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """Each part of :data:`ORDER`: its name, runs and estimated wall-clock hours."""
    out = []
    for name, tasks, steps in ORDER:
        part = [e for e in plan if e["task"] in tasks and e["step"] in steps]
        out.append((name, sum(e["runs"] for e in part), sum(e["wall_s"] for e in part) / 3600))
    return out


def order_rows(plan: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: each part of :data:`ORDER`, its runs, wall-clock and the running total."""
    rows, total = [], 0.0
    for name, runs, wall in parts(plan):
        total += wall
        rows.append(f"| {name} | {runs} | {wall:.2f} | {total:.2f} |")
    return rows


def budget(args: argparse.Namespace) -> int:
    """The plan's budget rule, for the lead before each part after the first: the wall-clock
    spent so far (every pilot and grid sweep's ``invocations.jsonl`` under ``--runs``, the
    timing's apart), then the parts of :data:`ORDER` from ``--next`` on (the one about to run;
    the ones before it ran and are in the spent time), added up in the order they run as the
    plan's table is: a part fits where the spent time plus its estimate and those of the parts
    before it that still run stays within :data:`BUDGET_H` hours; one that does not is
    dropped, with every later one. The first part (the primary tasks' pilot and grid) is never
    dropped."""
    spent = sum(i["wall_s"] for path in sorted(args.runs.rglob("invocations.jsonl"))
                if "timing" not in path.relative_to(args.runs).parts
                for i in invocations(path.parent)) / 3600  # fmt: skip
    plan = json.loads((args.results / "timing.json").read_text())["estimate"]
    print(f"spent: {spent:.2f} h of the budget's {BUDGET_H:g} h ({args.runs})")
    first = getattr(args, "next", 2)
    if not 2 <= first <= len(ORDER):
        raise SystemExit(f"--next {first}: the part about to run, 2 to {len(ORDER)} (the table)")
    total, dropped = spent, False
    for i, (name, _, wall) in enumerate(parts(plan), 1):
        line = f"- {name}: estimate {wall:.2f} h"
        if i < first:
            ran = ": ran, in the spent time" + (" (never dropped: the plan)" if i == 1 else "")
            print(line + ran)
        elif dropped:
            print(line + ": dropped, as an earlier part was")
        else:
            total += wall
            fits = total <= BUDGET_H
            verdict = "fits" if fits else "does not fit: dropped, with every later part"
            dropped = not fits
            print(f"{line}; spent + the parts to here {total:.2f} h: {verdict}")
    return 0


#: the loss whose cost in the second study stands for each of this study's (plain torch, as grpo)
COST_AS = {"gmpo": "gmpo", "grpo": "grpo", "dapo_trl": "grpo", "gspo": "gspo", "cispo_trl": "grpo"}


def throughput(results: Path) -> dict[str, float]:
    """The second study's grid: CPU seconds computed and wall-clock seconds over its
    invocations (every task's ``invocations.jsonl``), and their ratio."""
    tasks = json.loads((results / "pilot" / "pilot.json").read_text())["rates"]
    inv = [i for task in tasks for i in invocations(results / task)]
    cpu, wall = sum(i["cpu_s"] for i in inv), sum(i["wall_s"] for i in inv)
    return {"cpu_s": cpu, "wall_s": wall, "cpu_per_wall": cpu / wall, "invocations": len(inv),
            "runs": sum(i["runs"] for i in inv)}  # fmt: skip


def estimate(
    rows: list[dict[str, Any]], ratios: dict[str, dict[str, float]], rate: dict[str, float]
) -> list[dict[str, Any]]:
    """Each step's runs, CPU and wall-clock seconds per task (see :func:`timing`)."""
    out = []
    for task in (*TASKS, EXTRA_TASK):
        cost = statistics.fmean(ratios[task][COST_AS[v]] for v in LOSSES)
        run = {x["updates"]: x["run_cpu_s"] * cost for x in rows if x["task"] == task}
        warm = statistics.fmean(x["warm_cpu_s"] for x in rows if x["task"] == task)
        per = {"pilot": (len(LOSSES) * len(LADDER) * len(PILOT_SEEDS), 0, len(PILOT_SEEDS)),
               "pilot extension, at most": (len(LOSSES) * EXTEND * len(PILOT_SEEDS), 0, 0),
               "grid": (len(LOSSES) * len(GRID_SEEDS), len(GRID_SEEDS), len(GRID_SEEDS)),
               "robustness": (len(LOSSES) * len(GRID_SEEDS), 0, 0)}  # fmt: skip
        for step, (each, sanity, warms) in per.items():
            runs = sum(each + sanity * (u == 1) for u in REGIMES)
            cpu = sum((each + sanity * (u == 1)) * run[u] for u in REGIMES) + warms * warm
            out.append({"step": step, "task": task, "runs": runs, "cpu_s": cpu,
                        "wall_s": cpu / rate["cpu_per_wall"]})  # fmt: skip
    return out


def loss_cost(results: Path) -> dict[str, dict[str, float]]:
    """Per task of the second study's grid: each variant's mean CPU seconds per run over
    ``gmpo``'s."""
    out = {}
    for task in json.loads((results / "pilot" / "pilot.json").read_text())["rates"]:
        rs = records_of(results / task)
        mean = {v: statistics.fmean(r["cpu_s"] for r in rs if r["variant"] == v)
                for v in dict.fromkeys(r["variant"] for r in rs)}  # fmt: skip
        out[rs[0]["task"]] = {v: m / mean[GMPO] for v, m in mean.items()}
    return out
