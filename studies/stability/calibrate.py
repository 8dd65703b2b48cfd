"""A task's warm start, fixed by a rule on the calibration seeds only (900, 901, 902).

    python -m studies.stability.calibrate --out results/study-confirm            # add
    python -m studies.stability.calibrate --task chain_sum --out results/tasks-gym

``add`` keeps docs/study_plan.md's rule: the same optimizer and batch as ``reverse``'s warm
start; the number of supervised steps the smallest of 400, 800, 1600 at which a *clean* warm
start (noise 0) reaches an exact-match reward of at least 0.9 on every calibration seed; then the
noise the value of 0.05, 0.10, ..., 0.30 whose warm-start reward, averaged over the calibration
seeds, is closest to ``reverse``'s (0.22). Without a step count that reaches 0.9, 6-digit and
then 4-digit numbers, by the same rule. Writes ``calibration.json`` and ``calibration.md``.

Every other task (the reasoning-gym tasks) takes the band rule at its own length
(``studies/stability/band.py``): the smallest of 400, 800, 1600 supervised steps at which a
clean warm start (noise 0) reaches a reward of 0.5 on every calibration seed (else 1600); then,
by bisection over 0.00, 0.05, ..., 0.95, the smallest noise at which no seed's warm-start reward
(the task's own, at temperature 1 on 256 held-out prompts) is above 0.45, where every seed must
be at least 0.15 (else nothing is chosen): every seed in [0.15, 0.45]. A seed near zero reward has
groups whose rewards are all alike, and so no gradient: the band's floor rules such a warm start
out on each seed, its ceiling leaves room to learn. Then, at the chosen setting, what a run costs
and does: one ``gmpo`` run of the study's cell (100 steps, learning rate 2e-3) from each
calibration seed's warm start, and the warm start of the built-in transformers model that
``gmpo train --task NAME`` trains. Writes ``calibration_NAME.json`` and ``calibration_NAME.md``.
The values found go into the task's module by hand.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gmpo_tasks.catalog import TASKS, check_available
from studies.stability.band import calibrate_band, report_band
from studies.stability.run import Setup, init_worker, warm_start

SEEDS = (900, 901, 902)
LENGTHS = (8, 6, 4)
STEPS = (400, 800, 1600)
NOISES = (0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
CLEAN_TARGET = 0.9
REWARD_TARGET = 0.22


def _reward(length: int, steps: int, noise: float, seed: int) -> dict[str, Any]:
    warm = warm_start(Setup(task_name="add", length=length, noise=noise, warm_steps=steps), seed)
    return {"length": length, "steps": steps, "noise": noise, "seed": seed,
            "reward": warm["reward"], "cpu_s": warm["cpu_s"]}  # fmt: skip


def _batch(pool: ProcessPoolExecutor, cells: list[tuple[int, int, float]]) -> list[dict[str, Any]]:
    jobs = [(*c, s) for c in cells for s in SEEDS]
    out = list(pool.map(_reward, *zip(*jobs, strict=True)))
    for r in out:
        print(f"add L={r['length']} steps={r['steps']} noise={r['noise']} seed={r['seed']}: "
              f"reward {r['reward']:.3f} ({r['cpu_s']:.0f} s CPU)", flush=True)  # fmt: skip
    return out


def calibrate(workers: int) -> dict[str, Any]:
    """Every warm start the rule asks for, in its order, and the values it picks."""
    rows: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker) as pool:
        for length in LENGTHS:
            steps = None
            for n in STEPS:
                clean = _batch(pool, [(length, n, 0.0)])
                rows += clean
                if min(r["reward"] for r in clean) >= CLEAN_TARGET:
                    steps = n
                    break
            if steps is None:
                continue
            noisy = _batch(pool, [(length, steps, x) for x in NOISES])
            rows += noisy
            means = {x: statistics.fmean(r["reward"] for r in noisy if r["noise"] == x)
                     for x in NOISES}  # fmt: skip
            noise = min(NOISES, key=lambda x: (abs(means[x] - REWARD_TARGET), x))
            return {"length": length, "steps": steps, "noise": noise, "mean_reward": means,
                    "rows": rows}  # fmt: skip
    return {"length": None, "steps": None, "noise": None, "rows": rows}


def report(result: dict[str, Any], command: str, wall: float) -> str:
    lines = [
        "# The `add` task's warm start: calibration", "",
        f"Command: `{command}` ({wall:.0f} s wall-clock; seeds {', '.join(map(str, SEEDS))} "
        "only, before any confirmatory run). The rule is docs/study_plan.md's.", "",
        "| digits | steps | noise | seed | warm-start reward | CPU s |",
        "|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['length']} | {r['steps']} | {r['noise']:.2f} | {r['seed']} | {r['reward']:.3f} "
          f"| {r['cpu_s']:.0f} |" for r in result["rows"]), "",
    ]  # fmt: skip
    if result["length"] is None:
        lines.append("No step count reached a clean reward of 0.9 at any length.")
    else:
        lines += [
            f"Chosen: {result['length']}-digit numbers, {result['steps']} supervised steps (the "
            f"smallest count at which every clean warm start reached {CLEAN_TARGET}), noise "
            f"{result['noise']:.2f} (mean reward "
            f"{result['mean_reward'][result['noise']]:.3f}, the closest to {REWARD_TARGET}).", "",
            "| noise | mean warm-start reward |", "|---:|---:|",
            *(f"| {x:.2f} | {m:.3f} |" for x, m in result["mean_reward"].items()), "",
        ]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="add", choices=[t for t in TASKS if TASKS[t].warm.steps],
                   help="the task (default add, whose rule is the plan's)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("runs/calibration"))
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    try:
        check_available(TASKS[args.task])
    except ValueError as e:
        p.exit(2, f"{p.prog}: error: --task {args.task}: {e}\n")
    t0 = time.time()
    command = " ".join(["python -m studies.stability.calibrate", *argv])
    args.out.mkdir(parents=True, exist_ok=True)
    if args.task != "add":
        result = calibrate_band(args.task, args.workers)
        name = f"calibration_{args.task}"
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / f"{name}.md").write_text(report_band(result, command, time.time() - t0))
        print(f"chosen: steps {result['steps']}, noise {result['noise']}")
        return 0 if result["steps"] is not None else 1
    result = calibrate(args.workers)
    (args.out / "calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "calibration.md").write_text(report(result, command, time.time() - t0))
    print(f"chosen: length {result['length']}, steps {result['steps']}, noise {result['noise']}")
    return 0 if result["length"] is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
