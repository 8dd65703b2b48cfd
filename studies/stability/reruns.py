"""Runs of the confirmatory grid run again: do they reproduce the grid's records?

    python -m studies.stability.reruns results/study-confirm/reverse results/study-confirm/add \\
        --reruns results/study-confirm/reruns/reverse-seed1000 \\
        results/study-confirm/reruns/reverse-seed1000-again --out results/study-confirm/reruns

For every rerun run that the grid also ran (the same task, method, learning rate, gradient clip
and seed), its warm-start, final and peak reward beside the grid's, and whether its record
(every field but the CPU time) and its curves are the grid's exactly; then the same between
reruns of one run; then every rerun seed's warm-start reward beside the grid's. Writes
``reruns.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from studies.stability.sweep import read_curves

#: what identifies a run across sweeps
KEY = ("task", "variant", "lr", "grad_clip", "seed")
#: fields that differ between identical runs (the machine's time)
VOLATILE = ("cpu_s",)


def load(d: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    """A sweep's runs by :data:`KEY`, each its record with its curves (``"curves"``)."""
    records = json.loads((d / "summary.json").read_text())
    task = records[0]["task"] if records else None
    curves = {}
    for c in read_curves(d):
        curves[(task, c["variant"], c["lr"], c["grad_clip"], c["seed"])] = c["curves"]
    out = {}
    for r in records:
        k = tuple(r[f] for f in KEY)
        out[k] = {**r, "curves": curves.get(k)}
    return out


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs' records (but :data:`VOLATILE`) and curves are equal."""
    strip = {k: v for k, v in a.items() if k not in VOLATILE}
    return strip == {k: v for k, v in b.items() if k not in VOLATILE}


def compare(grid: dict[tuple[Any, ...], dict[str, Any]],
            reruns: dict[str, dict[tuple[Any, ...], dict[str, Any]]]) -> dict[str, Any]:  # fmt: skip
    """Each rerun run against the grid's, and each pair of reruns of one run."""
    rows = [{"rerun": name, "key": list(k), "grid": {f: grid[k][f] for f in _SHOWN},
             "again": {f: r[f] for f in _SHOWN}, "identical": same(grid[k], r)}
            for name, runs in reruns.items() for k, r in runs.items() if k in grid]  # fmt: skip
    between = [{"reruns": [x, y], "key": list(k), "identical": same(reruns[x][k], reruns[y][k])}
               for x, y in itertools.combinations(reruns, 2)
               for k in reruns[x] if k in reruns[y]]  # fmt: skip
    starts = {(r["task"], r["seed"]): r["start_reward"] for r in grid.values()}
    warm = sorted({(name, r["task"], r["seed"], starts[(r["task"], r["seed"])], r["start_reward"])
                   for name, runs in reruns.items() for r in runs.values()
                   if (r["task"], r["seed"]) in starts}, key=str)  # fmt: skip
    return {"against_grid": rows, "between_reruns": between,
            "warm_starts": [{"rerun": n, "task": t, "seed": s, "grid": g, "again": a}
                            for n, t, s, g, a in warm]}  # fmt: skip


_SHOWN = ("start_reward", "final_reward", "peak_reward")


def report(out: dict[str, Any], command: str) -> str:
    lines = ["# Runs of the confirmatory grid, run again", "", f"Command: `{command}`", "",
             "| rerun | task | method | lr | grad clip | seed | warm start: grid, rerun "
             "| final reward: grid, rerun | peak reward: grid, rerun | record and curves identical |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in out["against_grid"]:
        task, method, lr, clip, seed = r["key"]
        g, a = r["grid"], r["again"]
        lines.append(f"| {r['rerun']} | {task} | {method} | {lr:g} | "
                     f"{clip if clip is not None else 'none'} | {seed} | "
                     + " | ".join(f"{g[f]:.4f}, {a[f]:.4f}" for f in _SHOWN)
                     + f" | {'yes' if r['identical'] else 'no'} |")  # fmt: skip
    if out["between_reruns"]:
        lines += ["", "Between reruns of one run:", "",
                  "| reruns | task | method | lr | grad clip | seed | record and curves identical |",
                  "|---|---|---|---:|---|---:|---|"]  # fmt: skip
        for r in out["between_reruns"]:
            task, method, lr, clip, seed = r["key"]
            lines.append(f"| {' and '.join(r['reruns'])} | {task} | {method} | {lr:g} | "
                         f"{clip if clip is not None else 'none'} | {seed} | "
                         f"{'yes' if r['identical'] else 'no'} |")  # fmt: skip
    lines += ["", "Warm starts (the same task and seed; exact-match reward at temperature 1):", "",
              "| rerun | task | seed | grid | rerun | equal |", "|---|---|---:|---:|---:|---|",
              *(f"| {w['rerun']} | {w['task']} | {w['seed']} | {w['grid']:.4f} | {w['again']:.4f} "
                f"| {'yes' if w['grid'] == w['again'] else 'no'} |" for w in out["warm_starts"])]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grid", nargs="+", type=Path, help="the grid's sweep directories")
    p.add_argument("--reruns", nargs="+", type=Path, required=True, help="rerun sweep directories")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    grid = {k: v for d in args.grid for k, v in load(d).items()}
    out = compare(grid, {d.name: load(d) for d in args.reruns})
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m studies.stability.reruns", *argv])
    (args.out / "reruns.md").write_text(report(out, command))
    print(f"{len(out['against_grid'])} reruns of grid runs; {args.out}/reruns.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
