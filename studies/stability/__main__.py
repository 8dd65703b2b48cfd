"""GRPO against GMPO on a multi-token task: how often does training collapse?

Run from the repository root::

    python -m studies.stability --out runs/study         # the full sweep (docs/study.md)
    python -m studies.stability --methods grpo_wide,gmpo --lr 5e-3 --seeds 0,1,2 \\
        --steps 100 --out runs/mine                       # any subset
    python -m studies.stability --quick --out runs/quick  # a smoke run (CI), under a minute

A tiny causal transformer (``model.py``) learns to reverse a string of 16 digits
(``gmpo_tasks.reverse``): a supervised warm start on noisy demonstrations per seed
(``gmpo_tasks.warm_start``), then RL from it with each method (``methods.py``: the variants of
``gmpo_tasks.variants``) at each learning rate, without and with gradient clipping, on each seed
(``run.py``). Writes to ``--out``: ``summary.json`` (one record per run), ``summary.md``
(collapse counts, means ± std and medians, the sign tests: rules in ``gmpo_tasks.rules``, tables
in ``report.py``), ``curves.jsonl`` (every run's per-step metrics), ``invocations.jsonl`` (the
cost of each invocation), ``stability.png``, and the caches ``warm/`` and ``runs/`` (a rerun
reuses a run whose :func:`run_key` is unchanged: the method's definition, learning rate, clip,
seed, setup and the code it runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

from gmpo_tasks.rules import DROP, WINDOW, collapse, failed
from studies.stability.methods import METHODS, fingerprint, resolve
from studies.stability.plot import plot
from studies.stability.report import tables
from studies.stability.run import (
    TASK_SETUPS,
    TASKS,
    Setup,
    code_fingerprint,
    init_worker,
    run_job,
    warm_job,
)

# the learning rates in run order: the stress point first, then outward (a sweep cut short has
# whole learning rates, the most informative first)
FULL = {"methods": ",".join(METHODS), "lr": "5e-3,2e-3,1e-2,1e-3", "grad_clip": "none,1.0",
        "seeds": "0,1,2,3,4", "steps": 100}  # fmt: skip
QUICK = {"methods": "grpo,gmpo", "lr": "5e-3", "grad_clip": "none", "seeds": "0,1", "steps": 6}
QUICK_SETUP = {"length": 6, "warm_steps": 40, "prompts": 8, "minibatches": 4}
QUICK_LENGTH = {"reverse": 6, "add": 3}
#: a run's mechanism metrics (docs/study_plan.md): each a mean over steps 1-20 and over all steps
#: (spread: q99 - q01 at each step)
MECHANISM = ("q01", "q05", "q95", "q99", "spread", "seq_range", "clip_low", "clip_high", "entropy")
FIRST = 20


class _Parser(argparse.ArgumentParser):
    """argparse, with every refusal on one line (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _item(option: str, x: str, kind: str) -> Any:
    """One item of a comma list: ``kind`` is "method" (a name), "int", "lr" (a finite number
    > 0) or "clip" (a finite number > 0, or ``none``: no clipping; 0 is refused, not read as
    none)."""
    x = x.strip()
    if kind == "method":
        return x
    if kind == "clip" and x.lower() == "none":
        return None
    try:
        value = int(x) if kind == "int" else float(x)
    except ValueError:
        value = None
    if kind == "int" and value is not None:
        return value
    if value is None or not 0 < value < math.inf:
        want = {"int": "an integer", "lr": "a finite number > 0",
                "clip": "a finite number > 0, or none for no clipping"}[kind]  # fmt: skip
        raise ValueError(f"{option}: {x!r} is not {want}")
    return value


def _list(option: str, text: str, kind: str) -> list[Any]:
    """A comma list of distinct items (a duplicate would run once and count twice)."""
    values = [_item(option, x, kind) for x in text.split(",")]
    twice = [x for i, x in enumerate(values) if x in values[:i]]
    if twice:
        raise ValueError(f"{option}: {twice[0]} given twice; each value once")
    return values


def parse(argv: list[str]) -> argparse.Namespace:
    """The options, checked: a refusal is one line on stderr and exit status 2, before any work."""
    p = _Parser(prog="python -m studies.stability", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="reverse", choices=list(TASKS),
                   help="the task (default reverse)")  # fmt: skip
    p.add_argument("--methods", help=f"comma list of {', '.join(METHODS)} or module:function "
                   "(a method defined elsewhere; default: all built-in)")  # fmt: skip
    p.add_argument("--setup", default="", help="comma list of key=value overrides of the run "
                   "setup (studies/stability/run.py Setup), e.g. beta2=0.99,tied=false")  # fmt: skip
    p.add_argument("--lr", help=f"comma list of learning rates (default {FULL['lr']})")
    p.add_argument("--grad-clip", help="comma list of max gradient norms (> 0), 'none' for no "
                   f"clipping (default {FULL['grad_clip']})")  # fmt: skip
    p.add_argument("--seeds", help=f"comma list (default {FULL['seeds']})")
    p.add_argument("--steps", type=int, help=f"RL steps per run, >= 1 (default {FULL['steps']})")
    p.add_argument("--out", type=Path, default=Path("runs/study"), help="output directory")
    p.add_argument("--workers", type=int, default=2, help="worker processes, >= 1 (default 2)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {QUICK} on a {QUICK_SETUP} task")  # fmt: skip
    p.add_argument("--curves-lr", type=float, default=5e-3,
                   help="the figure's per-step curves: this learning rate, without gradient "
                   "clipping if the grid has it (default 5e-3)")  # fmt: skip
    p.add_argument("--fresh", action="store_true", help="recompute cached runs too")
    args = p.parse_args(argv)
    grid = QUICK if args.quick else FULL
    for key in ("methods", "lr", "grad_clip", "seeds", "steps"):
        if getattr(args, key) is None:
            setattr(args, key, grid[key])
    for option, value in (("--steps", args.steps), ("--workers", args.workers)):
        if value < 1:
            p.error(f"{option}: must be at least 1, got {value}")
    args.methods = [m.strip() for m in args.methods.split(",")]
    for m in args.methods:
        try:
            resolve(m)
        except ValueError as e:
            p.error(f"--methods: {e}")
    try:
        args.setup = setup_overrides(args.setup)
        args.methods = _list("--methods", ",".join(args.methods), "method")
        args.lr = _list("--lr", args.lr, "lr")
        args.grad_clip = _list("--grad-clip", args.grad_clip, "clip")
        args.seeds = _list("--seeds", args.seeds, "int")
    except ValueError as e:
        p.error(str(e))
    try:
        make_setup(args)
    except (TypeError, ValueError) as e:
        p.error(f"--setup: {e}")
    return args


def setup_overrides(text: str) -> dict[str, Any]:
    """``key=value,...`` as Setup fields, each parsed as its field's type; a ValueError names
    the bad one."""
    kinds = {f.name: f.type for f in dataclasses.fields(Setup)}
    out: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in kinds or key == "task_name":
            raise ValueError(f"--setup: {item!r} is not key=value with a key of {list(kinds)[1:]}")
        kind = kinds[key]
        if kind == "bool":
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--setup: {key} takes true or false, got {value!r}")
            out[key] = value.lower() == "true"
        else:
            try:
                out[key] = int(value) if kind == "int" else float(value)
            except ValueError:
                raise ValueError(f"--setup: {key} takes a number, got {value!r}") from None
    return out


def make_setup(args: argparse.Namespace) -> Setup:
    """The run setup of the options: the task's own settings, then --quick's, then --setup's."""
    quick = {**QUICK_SETUP, "length": QUICK_LENGTH[args.task]} if args.quick else {}
    fields = {**TASK_SETUPS[args.task], **quick, **args.setup}
    return Setup(task_name=args.task, steps=args.steps, **fields)


def run_name(method: str, lr: float, clip: float | None, seed: int) -> str:
    """A run's readable name (full-precision floats: ``repr``, not ``:g``)."""
    return f"{method}_lr{lr!r}_clip{clip!r}_seed{seed}"


def run_key(job: tuple[str, float, float | None, int], sdict: dict[str, Any], code: str) -> dict:
    """Everything a run's result depends on: the method's definition (not only its name), the
    learning rate, clip and seed, the setup, and the code the run executes (``code``)."""
    method, lr, clip, seed = job
    return {"method": method, "method_fingerprint": fingerprint(method), "lr": lr,
            "grad_clip": clip, "seed": seed, "setup": sdict, "code": code}  # fmt: skip


def digest(key: Any) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def record(job: tuple[str, float, float | None, int], warm: dict[str, Any],
           result: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The summary.json record of one run."""
    method, lr, clip, seed = job
    c = result["curves"]
    col = collapse(c["reward"], WINDOW, DROP)
    k = min(WINDOW, len(c["reward"]))
    first = [
        max(-a, b) for a, b in zip(c["log_ratio_min"][:10], c["log_ratio_max"][:10], strict=True)
    ]
    return {
        "method": method, "lr": lr, "seed": seed, "grad_clip": clip, "steps": len(c["reward"]),
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
    per_step = {k: c[k] for k in MECHANISM if k != "spread"}
    per_step["spread"] = [b - a for a, b in zip(c["q01"], c["q99"], strict=True)]
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
        code = code_fingerprint()
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
        # learning-rate major, in the order given: a sweep cut short has whole learning rates
        jobs = [(m, lr, c, s) for lr in args.lr for c in args.grad_clip for s in args.seeds
                for m in args.methods]  # fmt: skip
        keys = {j: run_key(j, sdict, code) for j in jobs}
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


def main(argv: list[str]) -> int:
    args = parse(argv)
    setup = make_setup(args)
    wall0, load0 = time.time(), os.getloadavg()
    runs, warm, spent = sweep(args, setup)
    wall = time.time() - wall0
    records = [{"task": setup.task_name, **record(j, warm[j[3]], res)} for j, res in runs]
    curves = [{"method": j[0], "lr": j[1], "grad_clip": j[2], "seed": j[3],
               "curves": {k: [float(f"{x:.4g}") for x in v] for k, v in res["curves"].items()}}
              for j, res in runs]  # fmt: skip
    out = args.out
    (out / "summary.json").write_text(json.dumps(records, indent=1) + "\n")
    (out / "curves.jsonl").write_text("".join(json.dumps(c) + "\n" for c in curves))
    curves_lr = args.curves_lr if args.curves_lr in args.lr else args.lr[0]
    cell = (curves_lr, None if None in args.grad_clip else args.grad_clip[0])
    plot(records, curves, args.methods, cell, out / "stability.png")
    cpu_runs = sum(r["cpu_s"] for r in records)
    inv = invocations(out)
    inv_wall, inv_cpu = sum(i["wall_s"] for i in inv), sum(i["cpu_s"] for i in inv)
    cpu_warm = sum(w["cpu_s"] for w in warm.values())
    command = shlex.join(["python", "-m", "studies.stability", *argv])
    head = [
        f"# Stability study: GRPO against GMPO on the {setup.task_name} task", "",
        f"Command: `{command}`", "",
        f"Setup: `{json.dumps(dataclasses.asdict(setup))}`; collapse rule: final {WINDOW}-step "
        f"mean reward at least {DROP} below the best {WINDOW}-step mean.", "",
        "## Cost", "",
        f"- runs: {len(records)}; CPU time of the runs: {cpu_runs:.0f} s (per run "
        f"{statistics.fmean(r['cpu_s'] for r in records):.1f} s mean, "
        f"{min(r['cpu_s'] for r in records):.1f} to {max(r['cpu_s'] for r in records):.1f} s); "
        f"warm starts: {len(warm)}, {cpu_warm:.0f} s CPU",
        f"- total CPU time: {cpu_runs + cpu_warm:.0f} s; on {args.workers} idle cores: "
        f"{(cpu_runs + cpu_warm) / args.workers / 60:.1f} min",
        f"- this invocation: {wall:.0f} s wall-clock ({wall / 60:.1f} min), {spent:.0f} s CPU "
        f"computed (the rest reused from {out}/runs), {args.workers} workers, load average "
        f"{load0[0]:.1f} at the start and {os.getloadavg()[0]:.1f} at the end",
        f"- every invocation that computed runs in {out}: {len(inv)}, {inv_wall:.0f} s "
        f"wall-clock ({inv_wall / 60:.1f} min) in all, {inv_cpu:.0f} s CPU computed", "",
        "| started (UTC) | workers | wall-clock s | runs | warm starts | CPU s | load average "
        "at the start, at the last run |", "|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {i['started']} | {i['workers']} | {i['wall_s']:.0f} | {i['runs']} | "
          f"{i['warm_starts']} | {i['cpu_s']:.0f} | {_load(i.get('load_start'))}, "
          f"{_load(i.get('load_now'))} |" for i in inv), "",
        "## Warm starts (supervised, per seed; reward and entropy at temperature 1)", "",
        "| seed | reward | entropy |", "|---:|---:|---:|",
        *(f"| {s} | {w['reward']:.3f} | {w['entropy']:.3f} |" for s, w in warm.items()), "",
    ]  # fmt: skip
    (out / "summary.md").write_text("\n".join(head) + tables(records, args.methods))
    print(f"{len(records)} runs, {wall:.0f} s wall-clock, {spent:.0f} s CPU computed; "
          f"{out}/summary.md")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
