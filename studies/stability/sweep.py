"""The study's sweep: warm starts, then every run (in worker processes), each cached under the
key of everything its result depends on; the summary record of a run; the cost of each
invocation (``invocations.jsonl``)."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import multiprocessing
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from gmpo_stats.outcome import DROP, WINDOW, collapse, failed
from studies.stability.files import read_json, write_atomic
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
    """:data:`CURVES_FILE` in ``out``: one JSON line per row (written whole or not at all)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(CURVES_FILE, "wb", compresslevel=9, fileobj=buffer, mtime=0) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    write_atomic(out / CURVES_FILE, buffer.getvalue())


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
    something in the directory), rewritten (whole, :func:`write_atomic`) after every finished
    job: an interrupted sweep keeps the wall-clock and CPU time it spent."""

    def __init__(self, path: Path, workers: int) -> None:
        self.path, self.t0 = path, time.time()
        self.rec: dict[str, Any] = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0)),
            "workers": workers, "load_start": round(os.getloadavg()[0], 2),
            "wall_s": 0.0, "runs": 0, "warm_starts": 0, "cpu_s": 0.0,
        }  # fmt: skip
        self.lines = [json.dumps(x) for x in invocations(path.parent)]

    def update(self, **add: float) -> None:
        for key, value in add.items():
            self.rec[key] += value
        self.rec["wall_s"] = round(time.time() - self.t0, 1)
        self.rec["load_now"] = round(os.getloadavg()[0], 2)
        write_atomic(self.path, "".join(f"{x}\n" for x in [*self.lines, json.dumps(self.rec)]))


def _load(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def invocations(out: Path) -> list[dict[str, Any]]:
    """The records of ``out``'s ``invocations.jsonl``; a line that cannot be read (cut short by
    an earlier version of the study) is left out, and one line says so."""
    path = out / "invocations.jsonl"
    records = []
    for n, line in enumerate(path.read_text().splitlines() if path.exists() else [], 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            print(f"{path}: line {n} cannot be read: left out of the cost table", flush=True)
    return records


class Interrupted(Exception):
    """The sweep stopped at Ctrl-C: ``kept`` of its ``total`` runs are computed and cached."""

    def __init__(self, kept: int, total: int) -> None:
        super().__init__(f"{kept} of {total} runs")
        self.kept, self.total = kept, total


class CtrlC:
    """Ctrl-C (SIGINT) during a sweep, counted (:attr:`pressed`): the first starts no more jobs,
    and those under way (at most one a worker) finish and are kept; the second raises
    KeyboardInterrupt, and the sweep ends its workers. The workers ignore SIGINT
    (``run.init_worker``): the main process decides."""

    def __init__(self) -> None:
        self.pressed = 0
        self._main = threading.current_thread() is threading.main_thread()

    def __enter__(self) -> CtrlC:
        if self._main:  # only the main thread can handle signals
            self._previous = signal.signal(signal.SIGINT, self._press)
        return self

    def _press(self, signum: int, frame: Any) -> None:
        self.pressed += 1
        if self.pressed > 1:
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._main:
            signal.signal(signal.SIGINT, self._previous)


def each(
    pool: Any,
    workers: int,
    calls: list[tuple[Any, tuple[Any, ...]]],
    fn: Callable[..., Any],
    keep: Callable[[Any, Any], None],
    ctrl_c: CtrlC,
) -> None:
    """``fn(*args)`` in ``pool`` for each ``(key, args)`` of ``calls``, in order, at most
    ``workers`` at a time (so that Ctrl-C waits for one job a worker at most), and
    ``keep(key, result)`` as each finishes. After Ctrl-C no job starts; those under way finish,
    are kept, then :class:`Interrupted` is raised by the caller (``ctrl_c.pressed``)."""
    waiting, running, told = calls[::-1], {}, False
    while waiting or running:
        while waiting and len(running) < workers and not ctrl_c.pressed:
            key, args = waiting.pop()
            running[pool.submit(fn, *args)] = key
        if not running:
            return
        finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
        for fut in finished:
            keep(running.pop(fut), fut.result())
        if ctrl_c.pressed and running and not told:
            print(f"Ctrl-C: starting nothing more, finishing the jobs under way ({len(running)});"
                  " Ctrl-C again stops now and loses them", file=sys.stderr, flush=True)  # fmt: skip
            told = True


def sweep(args: argparse.Namespace, setup: Setup) -> tuple[list[Any], dict[int, Any], float]:
    """Warm starts, then every run (cached ones reused); returns (records with curves, warm
    starts, CPU seconds spent in this invocation). Ctrl-C (:class:`CtrlC`) raises
    :class:`Interrupted` once the jobs under way are finished and cached."""
    with CtrlC() as ctrl_c:
        return _sweep(args, setup, ctrl_c)


def _sweep(
    args: argparse.Namespace, setup: Setup, ctrl_c: CtrlC
) -> tuple[list[Any], dict[int, Any], float]:
    sdict = dataclasses.asdict(setup)
    (args.out / "warm").mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    start = time.time()
    spent = 0.0
    log = Invocation(args.out / "invocations.jsonl", args.workers)
    code = setup.code_fingerprint()
    # a warm start depends on its settings and on the code that computes it
    wkey = digest({"warm": setup.warm_key(), "code": code})[:16]
    paths = {s: args.out / "warm" / f"{setup.warm_key()}_{wkey}_seed{s}.pt" for s in args.seeds}
    meta = {s: p.with_suffix(".json") for s, p in paths.items()}
    warm = {s: None if args.fresh or not paths[s].exists() else read_json(meta[s])
            for s in args.seeds}  # fmt: skip
    # learning-rate major, in the order given: a sweep cut short has whole learning rates;
    # with ``args.cells`` (--cells), only those (variant, learning rate) pairs
    pairs = getattr(args, "cells", None)
    jobs = [(m, lr, c, s) for lr in args.lr for c in args.grad_clip for s in args.seeds
            for m in args.variants if pairs is None or (m, lr) in pairs]  # fmt: skip
    prints = {v: fingerprint(v) for v in args.variants}
    keys = {j: run_key(j, sdict, code, prints) for j in jobs}
    cache = {j: args.out / "runs" / f"{run_name(*j)}_{digest(keys[j])[:16]}.json" for j in jobs}
    done = {j: None if args.fresh else read_json(cache[j]) for j in jobs}

    def cached(j: Job) -> bool:
        return isinstance(done[j], dict) and done[j].get("key") == keys[j]

    todo = [j for j in jobs if not cached(j)]
    computed = 0

    def keep_warm(s: int, info: dict[str, Any]) -> None:
        nonlocal spent
        write_atomic(meta[s], json.dumps(info) + "\n")
        warm[s], spent = info, spent + info["cpu_s"]
        log.update(warm_starts=1, cpu_s=info["cpu_s"])
        print(f"warm start seed {s}: reward {info['reward']:.3f}, {info['cpu_s']:.1f} s CPU")

    def keep_run(j: Job, result: dict[str, Any]) -> None:
        nonlocal spent, computed
        done[j], spent, computed = {"key": keys[j], **result}, spent + result["cpu_s"], computed + 1
        write_atomic(cache[j], json.dumps(done[j]) + "\n")
        log.update(runs=1, cpu_s=result["cpu_s"])
        print(f"[{computed}/{len(todo)} at {time.time() - start:.0f} s] {run_name(*j)}: final reward "
              f"{collapse(result['curves']['reward']).final:.3f}, {result['cpu_s']:.1f} s CPU",
              flush=True)  # fmt: skip

    with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=init_worker) as pool:
        try:
            each(pool, args.workers, [(s, (sdict, s, str(paths[s]))) for s in args.seeds
                                      if warm[s] is None], warm_job, keep_warm, ctrl_c)  # fmt: skip
            if not ctrl_c.pressed:
                each(pool, args.workers, [(j, (sdict, *j, str(paths[j[3]]))) for j in todo],
                     run_job, keep_run, ctrl_c)  # fmt: skip
        except KeyboardInterrupt:  # Ctrl-C twice: end the workers now
            pool.shutdown(wait=False, cancel_futures=True)
            for process in multiprocessing.active_children():
                process.terminate()
            raise
    if ctrl_c.pressed:
        raise Interrupted(sum(map(cached, jobs)), len(jobs))
    return [(j, done[j]) for j in jobs], warm, spent
