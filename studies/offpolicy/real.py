"""The off-policy study on the real model (docs/offpolicy_plan.md): the pilot, its rule (the
rates), the grid at 4 updates and the 1-update arm. Each run is one process of
:mod:`studies.offpolicy.one`, printed before it starts.

A run whose ``record.json`` exists is finished and never runs again: a step run again (in
another session) runs only what is left. A run without one (killed, or failed) is started again
from nothing. Every finished process, whatever its exit status, appends its wall-clock to
``attempts.jsonl`` (the time the budget counts as spent). Each step copies the finished records
into ``results/offpolicy/real/<part>/``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from studies.offpolicy import budget
from studies.offpolicy.design import (
    AGAINST,
    ARM_UPDATES,
    EXTEND,
    GRID_SEEDS,
    LADDER,
    LOSSES,
    PILOT_SEEDS,
    REACH,
    SPARE_SEEDS,
    UPDATES,
    counted,
    extension,
    margin,
    mde,
    paired_sd,
    pick,
)
from studies.stability.files import read_json

Cell = tuple[str, float, int]  # (loss, learning rate, seed)
PARTS = {"pilot": UPDATES, "grid": UPDATES, "arm": ARM_UPDATES}
#: the numbers measured before the plan that the budget's estimates come from
MEASURED = Path("results")


def run_dir(runs: Path, part: str, cell: Cell) -> Path:
    loss, lr, seed = cell
    return runs / "real" / part / f"{loss}_lr{lr!r}_seed{seed}"


def command(args: argparse.Namespace, part: str, cell: Cell) -> list[str]:
    """The process of one run (without ``--started``, which the launcher adds)."""
    loss, lr, seed = cell
    return [sys.executable, "-m", "studies.offpolicy", "one", "--task", args.task, "--loss", loss,
            "--lr", repr(lr), "--seed", str(seed), "--updates", str(PARTS[part]),
            "--out", str(run_dir(args.runs, part, cell)),
            *(["--", *args.extra] if args.extra else [])]  # fmt: skip


def launch(argv: list[str], log: Path) -> int:
    """Run one process, its output into ``log``; its exit status."""
    with log.open("w") as f:
        return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode


def run_cells(args: argparse.Namespace, part: str, cells: list[Cell]) -> None:
    """Each cell's run that has no record yet, in order (``--dry-run``: print them only)."""
    for cell in cells:
        out = run_dir(args.runs, part, cell)
        if (out / "record.json").exists():
            continue
        argv = command(args, part, cell)
        print(shlex.join(argv), flush=True)
        if args.dry_run:
            continue
        shutil.rmtree(out, ignore_errors=True)  # a killed run's outputs: nothing of it counts
        out.mkdir(parents=True)
        t0 = time.time()
        rc = launch([*argv[:4], "--started", repr(t0), *argv[4:]], out / "run.log")
        attempt = {"part": part, "loss": cell[0], "lr": cell[1], "seed": cell[2], "rc": rc,
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
                   "wall_s": round(time.time() - t0, 1)}  # fmt: skip
        with (args.runs / "real" / "attempts.jsonl").open("a") as f:
            f.write(json.dumps(attempt) + "\n")


def records(where: Path, part: str) -> list[dict[str, Any]]:
    """The finished records of a part: ``runs/.../<part>/*/record.json`` or the committed
    copies ``results/.../<part>/*.json``."""
    d = where / "real" / part
    paths = sorted(d.glob("*/record.json")) + sorted(d.glob("*.json"))
    return [r for p in paths if (r := read_json(p)) is not None]


def copy_records(args: argparse.Namespace, part: str) -> None:
    """Each finished record of ``part`` into ``results/offpolicy/real/<part>/<run>.json``, and the
    attempts' log beside."""
    dst = args.results / "real" / part
    for path in sorted((args.runs / "real" / part).glob("*/record.json")):
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dst / f"{path.parent.name}.json")
    log = args.runs / "real" / "attempts.jsonl"
    if log.exists():
        shutil.copy(log, args.results / "real" / "attempts.jsonl")


def pilot(args: argparse.Namespace) -> int:
    """Both losses at every rate of the ladder on the pilot seeds, then the extension where a
    pick sits on the edge (at most :data:`EXTEND` rounds); the records into results/."""
    cells = [(loss, lr, s) for lr in LADDER for loss in LOSSES for s in PILOT_SEEDS]
    run_cells(args, "pilot", cells)
    for _ in range(EXTEND if not args.dry_run else 0):
        more = extension(records(args.runs, "pilot"))
        run_cells(args, "pilot", [(loss, lr, s) for loss, lr in more for s in PILOT_SEEDS])
    if not args.dry_run:
        copy_records(args, "pilot")
    return 0


def outcome(pilot_records: list[dict[str, Any]], n: int = len(GRID_SEEDS)) -> dict[str, Any]:
    """The pilot's outcome: each loss's rate by the rule, the paired standard deviation, the
    MDE at ``n`` seeds and the *same* margin, whether *helps* is reachable (the comparator's
    pilot mean at its rate plus the MDE below :data:`REACH`), and ``stop`` where a loss has no
    rate at which the clip acted (the grid does not run)."""
    chosen = pick(pilot_records)
    sd, df = paired_sd(pilot_records)
    d = mde(sd, n)
    missing = [loss for loss in LOSSES if loss not in chosen["rates"]]
    out: dict[str, Any] = {**chosen, "paired_sd": sd, "df": df, "seeds": n, "mde": d,
                           "margin": margin(d),
                           "wall_s_mean": statistics.fmean(r["wall_s"] for r in pilot_records)}  # fmt: skip
    if missing:
        out["stop"] = f"the clip never acted at any pilot rate of {', '.join(missing)}"
    else:
        base = chosen["means"][AGAINST][repr(chosen["rates"][AGAINST])]["mean"]
        out["reachable"] = base + d < REACH
        out["against_mean"] = base
    return out


def rates(args: argparse.Namespace) -> int:
    """The rule on the committed pilot records: ``results/offpolicy/rates.json`` and ``.md``."""
    rs = records(args.results, "pilot")
    if not rs:
        raise SystemExit(f"no pilot record under {args.results / 'real' / 'pilot'}")
    out = outcome(rs)
    (args.results / "rates.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["# The off-policy study's pilot: each loss's rate", "",
             "The rule (docs/offpolicy_plan.md): per loss, among the rates at which the clip "
             "acted in every pilot run, the highest mean held-out reward after training over the "
             f"pilot seeds {', '.join(map(str, PILOT_SEEDS))} (the lower rate on a tie).", "",
             "| loss | rate | edge | " + " | ".join(f"lr {lr}" for lr in
                                                    sorted({k for d in out['means'].values() for k in d}, key=float)) + " |"]  # fmt: skip
    keys = sorted({k for d in out["means"].values() for k in d}, key=float)
    lines.append("|---|---:|---|" + "---:|" * len(keys))
    for loss in LOSSES:
        m = out["means"].get(loss, {})
        cells = ["—" if k not in m else f"{m[k]['mean']:.3f}" + ("" if m[k]["clip_acted"]
                 else " (clip never acted)") for k in keys]  # fmt: skip
        rate = out["rates"].get(loss)
        lines.append(f"| {loss} | {'—' if rate is None else f'{rate:g}'} | "
                     f"{out['edge'].get(loss, '')} | " + " | ".join(cells) + " |")  # fmt: skip
    lines += ["", f"Paired SD (pooled within rates, {out['df']} df): {out['paired_sd']:.4f}; "
              f"MDE at {out['seeds']} seeds: {out['mde']:.4f}; the *same* margin: "
              f"±{out['margin']:.4f}; mean wall-clock of a pilot run: {out['wall_s_mean']:.0f} s."]  # fmt: skip
    if "stop" in out:
        lines += ["", f"**The grid does not run:** {out['stop']}."]
    else:
        lines += ["", f"{AGAINST}'s pilot mean at its rate {out['against_mean']:.3f} + MDE = "
                  f"{out['against_mean'] + out['mde']:.3f}: *helps* "
                  f"{'is' if out['reachable'] else 'is NOT'} reachable (below {REACH})."]  # fmt: skip
    (args.results / "rates.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def chosen_rates(args: argparse.Namespace) -> dict[str, float]:
    out = read_json(args.results / "rates.json")
    if out is None:
        raise SystemExit("no rates.json: run the rates step (make study-offpolicy-rates) first")
    if "stop" in out:
        raise SystemExit(f"the plan stops before the grid: {out['stop']}")
    return {k: float(v) for k, v in out["rates"].items()}


def grid(args: argparse.Namespace) -> int:
    """Each loss at its own rate on the grid seeds; then, for each seed excluded (the clip never
    acted in one of its runs: a seed whose run failed is run again, not replaced), the next
    spare seed, while spares last."""
    r = chosen_rates(args)
    run_cells(args, "grid", [(loss, r[loss], s) for s in GRID_SEEDS for loss in LOSSES])
    for i, spare in enumerate(SPARE_SEEDS):  # a spare for each seed excluded so far
        if args.dry_run or i >= len(
            counted(records(args.runs, "grid"), GRID_SEEDS + SPARE_SEEDS)[1]
        ):
            break
        run_cells(args, "grid", [(loss, r[loss], spare) for loss in LOSSES])
    if not args.dry_run:
        copy_records(args, "grid")
    return 0


def spent_s(runs: Path) -> float:
    """The wall-clock spent so far: every finished process of the real model's runs and every
    invocation of the tiny model's sweeps."""
    total = 0.0
    log = runs / "real" / "attempts.jsonl"
    if log.exists():
        total += sum(json.loads(x)["wall_s"] for x in log.read_text().splitlines() if x.strip())
    for path in sorted((runs / "tiny").rglob("invocations.jsonl")):
        total += sum(json.loads(x)["wall_s"] for x in path.read_text().splitlines() if x.strip())
    return total


def arm(args: argparse.Namespace) -> int:
    """The 1-update arm at each loss's rate, seed by seed in the grid's order: a seed starts only
    if the time spent plus its estimate fits the budget; the first that does not ends it."""
    r = chosen_rates(args)
    parts = budget.estimate(budget.measured(MEASURED),
                            [x["wall_s"] for x in records(args.results, "pilot")])  # fmt: skip
    per_seed = parts[-1]["per_seed_s"]
    for s in GRID_SEEDS:
        cells = [(loss, r[loss], s) for loss in LOSSES]
        if all((run_dir(args.runs, "arm", c) / "record.json").exists() for c in cells):
            continue
        if not args.dry_run and not budget.fits(spent_s(args.runs), per_seed):
            print(f"the 1-update arm stops before seed {s}: the budget (docs/offpolicy_plan.md)")
            break
        run_cells(args, "arm", cells)
    if not args.dry_run:
        copy_records(args, "arm")
    return 0
