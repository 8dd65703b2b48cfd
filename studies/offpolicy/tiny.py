"""The off-policy study's tiny-model part (docs/offpolicy_plan.md): ``chain_sum`` at 1, 2, 4 and
16 updates per generation batch, GMPO against ``dapo_trl``, with the regime study's machinery
(``studies.stability.updates_plan``: the sweep's command, the shared warm starts, the ladder,
the rule and its extension, the committed summaries), its own pilot seeds and grid seeds.

The part starts only if the budget's rule lets it (:mod:`studies.offpolicy.budget`); the check is
made once, before its pilot. A sweep run again reuses every finished run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from studies.offpolicy import budget
from studies.offpolicy.design import (
    LOSSES,
    TINY_GRID_SEEDS,
    TINY_PILOT_SEEDS,
    TINY_REGIMES,
    TINY_TASK,
)
from studies.offpolicy.real import MEASURED, spent_s
from studies.stability.updates_plan import (
    EXTEND,
    LADDER,
    copy_summaries,
    extension,
    pick,
    records_of,
    regime_name,
    run_sweep,
    share_warm,
    sweep_argv,
)


def allowed(runs: Path, results: Path) -> bool:
    """The budget's rule for this part: the time spent plus its estimate within the budget.
    The verdict is written to ``results/offpolicy/tiny/budget.txt``."""
    cost = budget.measured(MEASURED)["tiny"]["wall_s"]
    spent = spent_s(runs)
    ok = budget.fits(spent, cost)
    results.mkdir(parents=True, exist_ok=True)
    (results / "budget.txt").write_text(
        f"spent {spent / 3600:.2f} h + estimate {cost / 3600:.2f} h "
        f"{'<=' if ok else '>'} {budget.BUDGET_H:g} h: {'runs' if ok else 'dropped'}\n"
    )
    return ok


def tiny_pilot(args: argparse.Namespace) -> int:
    """Both losses at every rate of the regime study's ladder on the pilot seeds, each regime,
    extended where a pick sits on the ladder's edge; the rule into ``tiny/pilot.json``."""
    results = args.results / "tiny"
    if not args.dry_run and not allowed(args.runs, results):
        print((results / "budget.txt").read_text(), end="")
        return 0
    cells = [(v, lr) for lr in LADDER for v in LOSSES]
    outcome: dict[str, Any] = {"ladder": list(LADDER), "seeds": list(TINY_PILOT_SEEDS),
                               "task": TINY_TASK, "regimes": {}}  # fmt: skip
    for u in TINY_REGIMES:
        out = args.runs / "tiny" / "pilot" / regime_name(u)
        if not args.dry_run:
            share_warm(out)
        run_sweep(sweep_argv(TINY_TASK, u, cells, TINY_PILOT_SEEDS, out, args.workers, 2e-3),
                  args.dry_run)  # fmt: skip
        if args.dry_run:
            continue
        more_cells = list(cells)
        for _ in range(EXTEND):
            more = extension(records_of(out))
            if not more:
                break
            more_cells += more
            run_sweep(sweep_argv(TINY_TASK, u, more_cells, TINY_PILOT_SEEDS, out, args.workers,
                                 2e-3), args.dry_run)  # fmt: skip
        outcome["regimes"][regime_name(u)] = pick(records_of(out))
        copy_summaries(out, results / "pilot" / regime_name(u))
    if not args.dry_run:
        (results / "pilot.json").write_text(json.dumps(outcome, indent=1) + "\n")
        print(json.dumps({u: o["rates"] for u, o in outcome["regimes"].items()}))
    return 0


def tiny_grid(args: argparse.Namespace) -> int:
    """Each loss at its own pilot rate on the grid seeds, each regime."""
    results = args.results / "tiny"
    if not (results / "pilot.json").exists():
        if args.dry_run:
            print("(the tiny grid's commands need tiny/pilot.json)")
            return 0
        raise SystemExit(f"no {results / 'pilot.json'}: run the tiny pilot first")
    outcome = json.loads((results / "pilot.json").read_text())
    for u in TINY_REGIMES:
        rates = outcome["regimes"][regime_name(u)]["rates"]
        out = args.runs / "tiny" / "grid" / regime_name(u)
        if not args.dry_run:
            share_warm(out)
        cells = [(v, rates[v]) for v in LOSSES]
        run_sweep(sweep_argv(TINY_TASK, u, cells, TINY_GRID_SEEDS, out, args.workers,
                             rates[LOSSES[0]]), args.dry_run)  # fmt: skip
        if not args.dry_run:
            copy_summaries(out, results / "grid" / regime_name(u))
    return 0
