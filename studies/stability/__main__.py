"""GRPO against GMPO and the other variants on a task: how often does training collapse?

Run from the repository root::

    python -m studies.stability --out runs/study         # the full sweep (docs/study.md)
    python -m studies.stability --variants grpo_wide,gmpo --lr 5e-3 --seeds 0,1,2 \\
        --steps 100 --out runs/mine                       # any subset
    python -m studies.stability --quick --out runs/quick  # a smoke run (CI), under a minute
    python -m studies.stability --cells gmpo=4e-3,grpo=2e-3 --out runs/own  # each its own rate

A tiny causal transformer (``model.py``) learns a task of ``gmpo_tasks.catalog.TASKS``
(``--task``; by default ``reverse``, a string of 16 digits): a supervised warm start on noisy
demonstrations per seed (``gmpo_tasks.warm_start``), then RL from it with each variant of
``gmpo_variants.VARIANTS`` (or ``module:function``) at each learning rate, without and with
gradient clipping, on each seed (``run.py``). Writes to ``--out``: ``summary.json`` (one record
per run), ``summary.md`` (collapse counts, means ± std and medians, the sign tests: rules in
``gmpo_stats``, tables in ``report.py``), ``curves.jsonl.gz`` (every run's per-step metrics),
``invocations.jsonl`` (the cost of each invocation), ``stability.png``, and the caches ``warm/``
and ``runs/`` (a rerun reuses a run whose key is unchanged: the variant's definition, learning
rate, clip, seed, setup and the code it runs; ``sweep.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from gmpo_stats.outcome import DROP, WINDOW
from gmpo_tasks.catalog import TASKS, TINY_TASKS, check_available
from gmpo_variants import VARIANTS, resolve
from studies.stability.files import write_atomic
from studies.stability.plot import plot
from studies.stability.report import tables
from studies.stability.run import Setup
from studies.stability.sweep import Interrupted, _load, invocations, record, sweep, write_curves

# the learning rates in run order: the stress point first, then outward (a sweep cut short has
# whole learning rates, the most informative first); the variants of docs/study.md's sweep
FULL = {"variants": "grpo,grpo_wide,gmpo,gmpo_narrow,gmpo_noclip,gmpo_seqclip",
        "lr": "5e-3,2e-3,1e-2,1e-3", "grad_clip": "none,1.0", "seeds": "0,1,2,3,4",
        "steps": 100}  # fmt: skip
QUICK = {"variants": "grpo,gmpo", "lr": "5e-3", "grad_clip": "none", "seeds": "0,1", "steps": 6}
#: --quick's setup: the task's ``quick_length`` and these
QUICK_SETUP = {"warm_steps": 40, "prompts": 8, "minibatches": 4}


class _Parser(argparse.ArgumentParser):
    """argparse, with every refusal on one line (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _item(option: str, x: str, kind: str) -> Any:
    """One item of a comma list: ``kind`` is "variant" (a name), "int", "lr" (a finite number
    > 0) or "clip" (a finite number > 0, or ``none``: no clipping; 0 is refused, not read as
    none)."""
    x = x.strip()
    if kind == "variant":
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
    """The options, checked: a refusal is one line on stderr and exit status 2, before any work.
    ``args.setup`` is the run's :class:`Setup`; each variant is resolved here once."""
    p = _Parser(prog="python -m studies.stability", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="reverse", choices=list(TINY_TASKS),
                   help="the task (default reverse)")  # fmt: skip
    p.add_argument("--variants", "--methods", dest="variants",
                   help=f"comma list of {', '.join(VARIANTS)} or module:function (a variant "
                   "defined elsewhere; default: docs/study.md's six); "
                   "--methods is the same option")  # fmt: skip
    p.add_argument("--setup", default="", help="comma list of key=value overrides of the run "
                   "setup (studies/stability/run.py Setup), e.g. beta2=0.99,tied=false")  # fmt: skip
    p.add_argument("--lr", help=f"comma list of learning rates (default {FULL['lr']})")
    p.add_argument("--cells", help="comma list of variant=lr: run these pairs only, each variant "
                   "at its own learning rates (instead of --variants x --lr)")  # fmt: skip
    p.add_argument("--grad-clip", help="comma list of max gradient norms (> 0), 'none' for no "
                   f"clipping (default {FULL['grad_clip']})")  # fmt: skip
    p.add_argument("--seeds", help=f"comma list (default {FULL['seeds']})")
    p.add_argument("--steps", type=int, help=f"RL steps per run, >= 1 (default {FULL['steps']})")
    p.add_argument("--out", type=Path, default=Path("runs/study"), help="output directory")
    p.add_argument("--workers", type=int, default=2, help="worker processes, >= 1 (default 2)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {QUICK} on the task at its quick length with {QUICK_SETUP}")  # fmt: skip
    p.add_argument("--curves-lr", type=float, default=5e-3,
                   help="the figure's per-step curves: this learning rate, without gradient "
                   "clipping if the grid has it (default 5e-3)")  # fmt: skip
    p.add_argument("--fresh", action="store_true", help="recompute cached runs too")
    args = p.parse_args(argv)
    if args.cells is not None and (args.variants is not None or args.lr is not None):
        p.error("--cells: names each variant's learning rates; give it without --variants/--lr")
    try:  # a task's extra (reasoning-gym's tasks), before any work
        check_available(TASKS[args.task])
    except ValueError as e:
        p.error(f"--task {args.task}: {e}")
    grid = QUICK if args.quick else FULL
    try:
        args.cells = None if args.cells is None else cells(args.cells)
    except ValueError as e:
        p.error(str(e))
    if args.cells is not None:
        args.variants = ",".join(dict.fromkeys(v for v, _ in args.cells))
        args.lr = ",".join(dict.fromkeys(repr(lr) for _, lr in args.cells))
    for key in ("variants", "lr", "grad_clip", "seeds", "steps"):
        if getattr(args, key) is None:
            setattr(args, key, grid[key])
    for option, value in (("--steps", args.steps), ("--workers", args.workers)):
        if value < 1:
            p.error(f"{option}: must be at least 1, got {value}")
    try:
        args.variants = _list("--variants", args.variants, "variant")
        for name in args.variants:
            resolve(name)
        args.lr = _list("--lr", args.lr, "lr")
        args.grad_clip = _list("--grad-clip", args.grad_clip, "clip")
        args.seeds = _list("--seeds", args.seeds, "int")
    except ValueError as e:
        p.error(str(e) if str(e).startswith("--") else f"--variants: {e}")
    try:
        quick = {**QUICK_SETUP, "length": TASKS[args.task].quick_length} if args.quick else {}
        args.setup = Setup.of(args.task, steps=args.steps,
                              **{**quick, **setup_overrides(args.setup)})  # fmt: skip
    except (TypeError, ValueError) as e:
        p.error(str(e) if str(e).startswith("--setup") else f"--setup: {e}")
    return args


def cells(text: str) -> list[tuple[str, float]]:
    """``variant=lr,...`` as distinct (variant, learning rate) pairs; a ValueError names the bad
    one."""
    out: list[tuple[str, float]] = []
    for item in (x.strip() for x in text.split(",")):
        name, sep, lr = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--cells: {item!r} is not variant=lr")
        pair = (name.strip(), _item("--cells", lr, "lr"))
        if pair in out:
            raise ValueError(f"--cells: {item} given twice; each pair once")
        out.append(pair)
    return out


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


def main(argv: list[str]) -> int:
    args = parse(argv)
    setup = args.setup
    wall0, load0 = time.time(), os.getloadavg()
    try:
        runs, warm, spent = sweep(args, setup)
    except Interrupted as stop:
        print(f"python -m studies.stability: interrupted: {stop.kept} of {stop.total} runs "
              f"computed and kept in {args.out}/runs; the same command computes the rest",
              file=sys.stderr)  # fmt: skip
        return 130
    except KeyboardInterrupt:
        print(f"python -m studies.stability: stopped; the finished runs are kept in "
              f"{args.out}/runs", file=sys.stderr)  # fmt: skip
        return 130
    wall = time.time() - wall0
    records = [{"task": setup.task_name, **record(j, warm[j[3]], res)} for j, res in runs]
    curves = [{"variant": j[0], "lr": j[1], "grad_clip": j[2], "seed": j[3],
               "curves": {k: [float(f"{x:.4g}") for x in v] for k, v in res["curves"].items()}}
              for j, res in runs]  # fmt: skip
    out = args.out
    write_atomic(out / "summary.json", json.dumps(records, indent=1) + "\n")
    write_curves(out, curves)
    curves_lr = args.curves_lr if args.curves_lr in args.lr else args.lr[0]
    cell = (curves_lr, None if None in args.grad_clip else args.grad_clip[0])
    plot(records, curves, args.variants, cell, out / "stability.png")
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
    write_atomic(out / "summary.md", "\n".join(head) + tables(records, args.variants))
    print(f"{len(records)} runs, {wall:.0f} s wall-clock, {spent:.0f} s CPU computed; "
          f"{out}/summary.md")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
