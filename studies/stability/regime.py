"""The regime question's table (exploratory): one row per setup and method, from the sweeps'
summary.json files.

    python -m studies.stability.regime runs/study-regime/base runs/study-regime/adam_beta2 ... \\
        --out results/study-regime

Each directory is one setup (its name is the row's); for each method: the runs, the mean
warm-start, final and peak reward (± std over seeds), the runs that failed (final below the warm
start's, or 0.3 below the peak) and that first learned (peak at least 0.3 above the warm start).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from studies.stability.confirm import _ms

LEARNED = 0.3


def rows(name: str, records: list[dict[str, Any]]) -> list[str]:
    out = []
    for method in dict.fromkeys(r["variant"] for r in records):
        rs = [r for r in records if r["variant"] == method]
        learned = sum(r["peak_reward"] - r["start_reward"] >= LEARNED for r in rs)
        out.append(f"| {name} | {method} | {len(rs)} | {_ms([r['start_reward'] for r in rs])} | "
                   f"{_ms([r['final_reward'] for r in rs])} | {_ms([r['peak_reward'] for r in rs])} | "
                   f"{learned}/{len(rs)} | {sum(r['failed'] for r in rs)}/{len(rs)} |")  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=Path("runs/study-regime"))
    args = p.parse_args(argv)
    lines = ["# The regime question (exploratory): one difference at a time at learning rate 5e-3",
             "", f"Command: `python -m studies.stability.regime {' '.join(argv)}`", "",
             "| setup | method | runs | warm start | final reward | peak reward | "
             f"learned first (peak >= warm start + {LEARNED}) | failed |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for d in args.runs:
        lines += rows(d.name, json.loads((d / "summary.json").read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "regime.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
