"""The band rule of ``studies.stability.calibrate`` (every task but ``add``), and its report.

At the task's own length, on the calibration seeds only:

1. the supervised steps: the smallest of :data:`STEPS` at which a clean warm start (noise 0)
   reaches :data:`CLEAN` on every seed (the model answers right more often than not, and
   noise, not a lack of training, then sets its errors, as in ``reverse``'s and ``add``'s warm
   starts), else the largest;
2. the noise: the smallest of :data:`NOISES` at which no seed's warm-start reward is above
   the band :data:`BAND`, found by bisection (more noise, a lower reward), which must then hold
   every seed inside the band: at least its floor, so that no seed starts near zero reward,
   where a group's rewards are all alike and give no gradient.

Then, at the chosen setting, one ``gmpo`` run of the study's cell from each seed's warm start
(its CPU time and its rewards) and the warm start of the transformers model that
``gmpo train --task NAME`` trains.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from gmpo_tasks.catalog import TASKS
from gmpo_tasks.task import CELL
from studies.stability.run import Setup, init_worker, rl_run, warm_start

SEEDS = (900, 901, 902)
STEPS = (400, 800, 1600)
CLEAN = 0.5
NOISES = tuple(round(0.05 * i, 2) for i in range(20))  # 0.0, 0.05, ..., 0.95
BAND = (0.15, 0.45)
METHOD = "gmpo"


def _setup(task: str, steps: int, noise: float) -> Setup:
    return Setup.of(task, warm_steps=steps, noise=noise)


def _warm(task: str, steps: int, noise: float, seed: int) -> dict[str, Any]:
    warm = warm_start(_setup(task, steps, noise), seed)
    return {"steps": steps, "noise": noise, "seed": seed, "reward": warm["reward"],
            "entropy": warm["entropy"], "cpu_s": warm["cpu_s"], "warm": warm}  # fmt: skip


def _run(task: str, steps: int, noise: float, seed: int, warm: dict[str, Any]) -> dict[str, Any]:
    """One ``gmpo`` run of the study's cell from the seed's warm start ``warm``, and on the
    first seed the warm start of the built-in transformers model (both CPU-timed)."""
    setup = _setup(task, steps, noise)
    cpu0 = time.process_time()
    curves = rl_run(setup, warm, METHOD, CELL.lr, None, seed)
    cpu_run = time.process_time() - cpu0
    reward = curves["reward"]
    hf = _hf_warm_start(task, steps, noise, seed) if seed == SEEDS[0] else {}
    return {"seed": seed, "warm_reward": warm["reward"], "warm_cpu_s": warm["cpu_s"],
            "first10": statistics.fmean(reward[:10]), "last10": statistics.fmean(reward[-10:]),
            "length_first": curves["length"][0], "length_last": curves["length"][-1],
            "run_cpu_s": cpu_run, **hf}  # fmt: skip


def _hf_warm_start(task: str, steps: int, noise: float, seed: int) -> dict[str, Any]:
    """The warm start of ``gmpo train --task NAME``'s model (gmpo_tasks.warm_start.warm_model)
    and its sampled reward."""
    import torch

    from gmpo_tasks.models import gpt2_model
    from gmpo_tasks.warm_start import sampled_reward, warm_start_hf

    t = dataclasses.replace(TASKS[task], noise=noise,
                            warm=dataclasses.replace(TASKS[task].warm, steps=steps))  # fmt: skip
    cpu0 = time.process_time()
    torch.manual_seed(seed)
    tokenizer = t.tokenizer()
    net = gpt2_model(tokenizer, t.positions, seed=seed, hidden_size=t.hidden_size, heads=t.heads)
    warm_start_hf(net, tokenizer, t, seed=seed, settings=t.warm)
    reward = sampled_reward(net, tokenizer, t, seed=seed)
    return {"hf_reward": reward, "hf_cpu_s": time.process_time() - cpu0}


def _batch(pool: ProcessPoolExecutor, task: str, steps: int, noise: float) -> list[dict[str, Any]]:
    n = len(SEEDS)
    out = list(pool.map(_warm, [task] * n, [steps] * n, [noise] * n, SEEDS))
    for r in out:
        print(f"{task} steps={steps} noise={noise} seed={r['seed']}: reward {r['reward']:.3f} "
              f"({r['cpu_s']:.0f} s CPU)", flush=True)  # fmt: skip
    return out


def calibrate_band(task: str, workers: int) -> dict[str, Any]:
    """Every warm start the band rule asks for, in its order, the setting it picks, and the
    runs from it."""
    done: dict[tuple[int, float], list[dict[str, Any]]] = {}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker) as pool:

        def rewards(steps: int, noise: float) -> list[float]:
            if (steps, noise) not in done:
                done[steps, noise] = _batch(pool, task, steps, noise)
            return [r["reward"] for r in done[steps, noise]]

        steps = next((n for n in STEPS if min(rewards(n, 0.0)) >= CLEAN), STEPS[-1])
        lo, hi = 0, len(NOISES)  # the first noise at which every seed is at most the ceiling
        while lo < hi:
            mid = (lo + hi) // 2
            if max(rewards(steps, NOISES[mid])) <= BAND[1]:
                hi = mid
            else:
                lo = mid + 1
        noise = NOISES[lo] if lo < len(NOISES) else None
        if noise is not None and min(rewards(steps, noise)) < BAND[0]:
            noise = None  # the seeds spread wider than the band
        runs: list[dict[str, Any]] = []
        if noise is not None:
            n = len(SEEDS)
            warm = [r.pop("warm") for r in done[steps, noise]]
            runs = list(pool.map(_run, [task] * n, [steps] * n, [noise] * n, SEEDS, warm))
    for batch in done.values():
        for r in batch:
            r.pop("warm", None)
    t = TASKS[task]
    return {"task": task, "length": t.length, "steps": steps if noise is not None else None,
            "noise": noise, "clean": CLEAN, "band": list(BAND), "seeds": list(SEEDS),
            "rows": [r for batch in done.values() for r in batch], "runs": runs,
            "examples": _examples(task)}  # fmt: skip


def _examples(task: str) -> list[dict[str, Any]]:
    t = TASKS[task]
    prompts = t.prompts(4, seed="examples")
    return [{"prompt": p, "answer": t.target(p)} for p in prompts]


def _hf(row: dict[str, Any], key: str, spec: str) -> str:
    return format(row[key], spec) if key in row else "-"


def report_band(result: dict[str, Any], command: str, wall: float) -> str:
    task, lo, hi = result["task"], *result["band"]
    lines = [
        f"# The `{task}` task's warm start: calibration", "",
        f"Command: `{command}` ({wall:.0f} s wall-clock; seeds "
        f"{', '.join(map(str, result['seeds']))} only). The rule (studies/stability/band.py), at "
        f"length {result['length']}: the smallest warm-start step count of "
        f"{', '.join(map(str, STEPS))} at which a clean warm start (noise 0) reaches "
        f"{result['clean']} on every seed, else {STEPS[-1]}; then the smallest noise of 0.00, "
        f"0.05, ..., {NOISES[-1]} at which no seed is above {hi} (bisection), where every seed "
        f"must be at least {lo}: every seed's warm-start reward in [{lo}, {hi}].", "",
        "| steps | noise | seed | warm-start reward | entropy | CPU s |",
        "|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['steps']} | {r['noise']:.2f} | {r['seed']} | {r['reward']:.3f} | "
          f"{r['entropy']:.3f} | {r['cpu_s']:.1f} |" for r in result["rows"]), "",
    ]  # fmt: skip
    if result["steps"] is None:
        return "\n".join([*lines, "No step count and noise put every seed in the band.", ""])
    lines += [
        f"Chosen: {result['steps']} supervised steps, noise {result['noise']:.2f}.", "",
        f"## From the chosen warm start: one `{METHOD}` run of the study's cell per seed", "",
        f"100 steps, learning rate {CELL.lr:g}, no gradient clipping (the study's setting); the "
        "mean reward of the first and of the last 10 steps, the mean completion length (valid "
        "tokens, the end-of-sequence token included) at the first and the last step, the CPU "
        "time of the warm start and of the run (one thread). Then, on the first seed, the warm "
        "start of the built-in transformers model that `gmpo train --task " + task + "` trains, "
        "at the same setting, and its sampled reward (256 held-out prompts, temperature 1).", "",
        "| seed | warm-start reward | first 10 | last 10 | length first, last | warm-start CPU s "
        "| run CPU s | transformers warm-start reward | its CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['seed']} | {r['warm_reward']:.3f} | {r['first10']:.3f} | {r['last10']:.3f} | "
          f"{r['length_first']:.2f}, {r['length_last']:.2f} | {r['warm_cpu_s']:.1f} | "
          f"{r['run_cpu_s']:.1f} | {_hf(r, 'hf_reward', '.3f')} | {_hf(r, 'hf_cpu_s', '.1f')} |"
          for r in result["runs"]), "",
        "## Example prompts and the demonstrations' answers", "",
        "| prompt | answer |", "|---|---|",
        *(f"| `{e['prompt']}` | `{e['answer']}` |" for e in result["examples"]), "",
    ]  # fmt: skip
    return "\n".join(lines)
