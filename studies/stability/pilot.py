"""The second study's pilot rule (docs/which_loss_plan.md), applied to the pilot seeds' runs only:
each task's learning rate for the grid, and its stress rate.

    python -m studies.stability.pilot runs/which-loss-pilot/reverse ... --out results/which-loss/pilot

The rule, fixed in the plan before the pilot ran: a variant *learns* at a rate when the median
over the pilot seeds of its runs' gain (final reward minus the seed's warm-start reward) is at
least :data:`MARGIN`. The task's rate is the largest rate of :data:`LADDER` at which every
variant learns; where no rate has every variant learning, the rate at which the most variants
learn (the larger on a tie), said so in the outcome; where none learns at any rate, the task is
dropped. Its stress rate is twice its rate, kept only where at least one variant learns there (a
cell in which every variant fails says nothing). Writes ``pilot.json`` (``{"rates": {task:
[rate, stress]}, ...}``, which the grid's make target reads) and ``pilot.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

#: the learning rates the pilot runs, each twice the one before
LADDER = (1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
#: the median gain over the warm start at which a variant learns
MARGIN = 0.1


def median_gains(records: list[dict[str, Any]]) -> dict[tuple[str, float], float]:
    """``(variant, lr) -> median over seeds of final_reward - start_reward``."""
    by: dict[tuple[str, float], list[float]] = {}
    for r in records:
        by.setdefault((r["variant"], r["lr"]), []).append(r["final_reward"] - r["start_reward"])
    return {k: statistics.median(v) for k, v in by.items()}


def pick(records: list[dict[str, Any]], margin: float = MARGIN) -> dict[str, Any]:
    """The rule on one task's pilot records: ``{"rate", "stress", "every", "learners"}``
    (``rate`` None: the task is dropped; ``every``: whether every variant learns at ``rate``;
    ``learners``: per rate, the variants that learn)."""
    gains = median_gains(records)
    variants = sorted({v for v, _ in gains})
    rates = sorted({lr for _, lr in gains})
    learners = {lr: [v for v in variants if gains.get((v, lr), -1.0) >= margin] for lr in rates}
    every = [lr for lr in rates if len(learners[lr]) == len(variants)]
    if every:
        rate: float | None = max(every)
    else:
        most = max((len(learners[lr]) for lr in rates), default=0)
        rate = max(lr for lr in rates if len(learners[lr]) == most) if most else None
    stress = None
    if rate is not None and learners.get(2 * rate):
        stress = 2 * rate
    return {"rate": rate, "stress": stress, "every": bool(every), "learners": learners,
            "gains": {f"{v} {lr!r}": g for (v, lr), g in sorted(gains.items())}}  # fmt: skip


def _table(task: str, records: list[dict[str, Any]], out: dict[str, Any]) -> list[str]:
    gains = median_gains(records)
    variants = sorted({v for v, _ in gains})
    rates = sorted({lr for _, lr in gains})
    lines = [f"### {task}", "", "Median gain over the warm start (final reward minus the seed's "
             "warm-start reward) over the pilot seeds; **bold**: the variant learns (gain >= "
             f"{MARGIN}).", "", "| variant | " + " | ".join(f"lr {lr:g}" for lr in rates) + " |",
             "|---|" + "---:|" * len(rates)]  # fmt: skip
    for v in variants:
        cells = []
        for lr in rates:
            g = gains.get((v, lr))
            cells.append("—" if g is None else (f"**{g:+.3f}**" if g >= MARGIN else f"{g:+.3f}"))
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    if out["rate"] is None:
        verdict = "no variant learns at any rate: the task is dropped from the grid"
    else:
        how = (
            "every variant learns"
            if out["every"]
            else (
                "no rate has every variant learning; the most do here "
                f"({len(out['learners'][out['rate']])} of {len(variants)})"
            )
        )
        stress = (f"stress rate {out['stress']:g}" if out["stress"] is not None
                  else "no stress rate (no variant learns at twice the rate)")  # fmt: skip
        verdict = f"rate {out['rate']:g} ({how}); {stress}"
    return [*lines, "", f"Outcome: {verdict}.", ""]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.stability.pilot", description=__doc__)
    p.add_argument("sweeps", nargs="*", type=Path, help="each task's pilot sweep directory")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rates-of", metavar="TASK",
                   help="print TASK's grid rates from --out's pilot.json (a comma list)")  # fmt: skip
    args = p.parse_args(argv)
    if args.rates_of:
        rates = json.loads((args.out / "pilot.json").read_text())["rates"][args.rates_of]
        print(",".join(repr(r) for r in rates if r is not None))
        return 0
    outcome: dict[str, Any] = {"ladder": list(LADDER), "margin": MARGIN, "tasks": {}}
    lines = ["# The second study's pilot: each task's learning rate", "",
             f"Command: `python -m studies.stability.pilot {' '.join(map(str, args.sweeps))} "
             f"--out {args.out}`", "", "The rule (docs/which_loss_plan.md, fixed before the "
             "pilot ran) is applied to the pilot seeds' runs only.", ""]  # fmt: skip
    for sweep in args.sweeps:
        records = json.loads((sweep / "summary.json").read_text())
        task = records[0]["task"]
        out = pick(records)
        outcome["tasks"][task] = out
        lines += _table(task, records, out)
    outcome["rates"] = {t: [o["rate"], o["stress"]] for t, o in outcome["tasks"].items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pilot.json").write_text(json.dumps(outcome, indent=1) + "\n")
    (args.out / "pilot.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
