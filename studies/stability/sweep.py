"""The study's sweep: warm starts, then every run (in worker processes), each cached under the
key of everything its result depends on; the summary record of a run; the cost of each
invocation (``invocations.jsonl``)."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gmpo_stats.outcome import DROP, WINDOW, collapse, failed
from studies.stability.fingerprint import fingerprint
from studies.stability.run import Setup, init_worker, run_job, warm_job

#: a run's mechanism metrics (docs/study_plan.md): each a mean over steps 1-20 and over all steps
#: (spread: q99 - q01 at each step; length: the completions' mean number of valid tokens)
MECHANISM = ("q01", "q05", "q95", "q99", "spread", "seq_range", "clip_low", "clip_high", "entropy",
             "length")  # fmt: skip
FIRST = 20
Job = tuple[str, float, float | None, int]  # (variant, learning rate, gradient clip, seed)
#: every run's per-step curves, one JSON line a run, gzip-compressed (a byte-stable file: no
#: time stamp in the header)
CURVES_FILE = "curves.jsonl.gz"


def write_curves(out: Path, rows: list[dict[str, Any]]) -> None:
    """:data:`CURVES_FILE` in ``out``: one JSON line per row."""
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with gzip.GzipFile(out / CURVES_FILE, "wb", compresslevel=9, mtime=0) as f:
        f.write(data)


def read_curves(out: Path) -> list[dict[str, Any]]:
    """The rows of ``out``'s :data:`CURVES_FILE`."""
    with gzip.open(out / CURVES_FILE, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_name(variant: str, lr: float, clip: float | None, seed: int) -> str:
    """A run's readable name (full-precision floats: ``repr``, not ``:g``)."""
    return f"{variant}_lr{lr!r}_clip{clip!r}_seed{seed}"


def run_key(job: Job, sdict: dict[str, Any], code: str, prints: dict[str, str]) -> dict:
    """Everything a run's result depends on: the variant's definition (``prints``: its
    fingerprint, not only its name), the learning rate, clip and seed, the setup, and the code
    the run executes (``code``)."""
    variant, lr, clip, seed = job
    return {"variant": variant, "variant_fingerprint": prints[variant], "lr": lr,
            "grad_clip": clip, "seed": seed, "setup": sdict, "code": code}  # fmt: skip


def digest(key: Any) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def record(job: Job, warm: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The summary.json record of one run."""
    variant, lr, clip, seed = job
    c = result["curves"]
    col = collapse(c["reward"], WINDOW, DROP)
    k = min(WINDOW, len(c["reward"]))
    first = [
        max(-a, b) for a, b in zip(c["log_ratio_min"][:10], c["log_ratio_max"][:10], strict=True)
    ]
    return {
        "variant": variant, "lr": lr, "seed": seed, "grad_clip": clip, "steps": len(c["reward"]),
        "final_reward": col.final, "peak_reward": col.peak, "collapsed": col.collapsed,
        "start_reward": float(warm["reward"]), "max_grad_norm": max(c["grad_norm"]),
        "log_ratio_min": min(c["log_ratio_min"]), "log_ratio_max": max(c["log_ratio_max"]),
        "log_ratio_absmax_first10": statistics.fmean(first),
        "entropy_start": c["entropy"][0], "entropy_end": statistics.fmean(c["entropy"][-k:]),
        "clipped_fraction_mean": statistics.fmean(c["clipped_fraction"]),
        "skipped_updates": int(sum(c["skipped"])), "cpu_s": result["cpu_s"],
        "failed": failed(c["reward"], float(warm["reward"])),
        **mechanism(c),
    }  # fmt: skip


def mechanism(c: dict[str, list[float]]) -> dict[str, float]:
    """A run's :data:`MECHANISM` metrics: ``<name>_first20`` (the mean over steps 1-20) and
    ``<name>_all`` (over every step)."""
    spread = [b - a for a, b in zip(c["q01"], c["q99"], strict=True)]
    per_step = {k: spread if k == "spread" else c[k] for k in MECHANISM}
    out = {}
    for k in MECHANISM:
        out[f"{k}_first{FIRST}"] = statistics.fmean(per_step[k][:FIRST])
        out[f"{k}_all"] = statistics.fmean(per_step[k])
    return out


class Invocation:
    """This invocation's line in ``invocations.jsonl`` (one line per invocation that computed
    something in the directory), rewritten after every finished job: an interrupted sweep keeps
    the wall-clock and CPU time it spent."""

    def __init__(self, path: Path, workers: int) -> None:
        self.path, self.t0 = path, time.time()
        self.rec: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0)),
            "workers": workers, "load_start": round(os.getloadavg()[0], 2),
            "wall_s": 0.0, "runs": 0, "warm_starts": 0, "cpu_s": 0.0,
        }  # fmt: skip
        self.lines = path.read_text().splitlines() if path.exists() else []

    def update(self, **add: float) -> None:
        for key, value in add.items():
            self.rec[key] += value
        self.rec["wall_s"] = round(time.time() - self.t0, 1)
        self.rec["load_now"] = round(os.getloadavg()[0], 2)
        self.path.write_text("".join(f"{x}\n" for x in [*self.lines, json.dumps(self.rec)]))


def _load(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def invocations(out: Path) -> list[dict[str, Any]]:
    path = out / "invocations.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def sweep(args: argparse.Namespace, setup: Setup) -> tuple[list[Any], dict[int, Any], float]:
    """Warm starts, then every run (cached ones reused); returns (records with curves, warm
    starts, CPU seconds spent in this invocation)."""
    sdict = dataclasses.asdict(setup)
    (args.out / "warm").mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    start = time.time()
    spent = 0.0
    log = Invocation(args.out / "invocations.jsonl", args.workers)
    with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=init_worker) as pool:
        warm: dict[int, Any] = {}
        code = setup.code_fingerprint()
        # a warm start depends on its settings and on the code that computes it
        wkey = digest({"warm": setup.warm_key(), "code": code})[:16]
        paths = {s: args.out / "warm" / f"{setup.warm_key()}_{wkey}_seed{s}.pt" for s in args.seeds}
        meta = {s: p.with_suffix(".json") for s, p in paths.items()}
        todo = [s for s in args.seeds if args.fresh or not meta[s].exists()]
        for s, info in zip(todo, pool.map(warm_job, [sdict] * len(todo), todo,
                                          [str(paths[s]) for s in todo]), strict=True):  # fmt: skip
            meta[s].write_text(json.dumps(info) + "\n")
            spent += info["cpu_s"]
            log.update(warm_starts=1, cpu_s=info["cpu_s"])
            print(f"warm start seed {s}: reward {info['reward']:.3f}, {info['cpu_s']:.1f} s CPU")
        warm = {s: json.loads(meta[s].read_text()) for s in args.seeds}
        # learning-rate major, in the order given: a sweep cut short has whole learning rates;
        # with ``args.cells`` (--cells), only those (variant, learning rate) pairs
        pairs = getattr(args, "cells", None)
        jobs = [(m, lr, c, s) for lr in args.lr for c in args.grad_clip for s in args.seeds
                for m in args.variants if pairs is None or (m, lr) in pairs]  # fmt: skip
        prints = {v: fingerprint(v) for v in args.variants}
        keys = {j: run_key(j, sdict, code, prints) for j in jobs}
        cache = {j: args.out / "runs" / f"{run_name(*j)}_{digest(keys[j])[:16]}.json" for j in jobs}

        def cached(j: Any) -> bool:
            return (not args.fresh and cache[j].exists()
                    and json.loads(cache[j].read_text()).get("key") == keys[j])  # fmt: skip

        todo_jobs = [j for j in jobs if not cached(j)]
        futures = {pool.submit(run_job, sdict, *j, str(paths[j[3]])): j for j in todo_jobs}
        for n, (fut, j) in enumerate(futures.items(), 1):
            result = fut.result()
            spent += result["cpu_s"]
            cache[j].write_text(json.dumps({"key": keys[j], **result}) + "\n")
            log.update(runs=1, cpu_s=result["cpu_s"])
            print(f"[{n}/{len(todo_jobs)} at {time.time() - start:.0f} s] {run_name(*j)}: final reward "
                  f"{collapse(result['curves']['reward']).final:.3f}, {result['cpu_s']:.1f} s CPU",
                  flush=True)  # fmt: skip
    runs = [(j, json.loads(cache[j].read_text())) for j in jobs]
    return runs, warm, spent
