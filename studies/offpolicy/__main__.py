"""The off-policy study's steps (docs/offpolicy_plan.md), in the plan's order:

    python -m studies.offpolicy pilot       # the real model's pilot (both losses x the ladder)
    python -m studies.offpolicy rates       # the rule: results/offpolicy/rates.json (commit it)
    python -m studies.offpolicy grid        # 4 updates, each loss at its rate, the grid seeds
    python -m studies.offpolicy tiny-pilot  # chain_sum's pilot, if the budget allows (commit it)
    python -m studies.offpolicy tiny-grid   # chain_sum's grid at its pilot's rates
    python -m studies.offpolicy arm         # the 1-update arm, seed by seed within the budget
    python -m studies.offpolicy budget      # spent so far, and what each part's rule says
    python -m studies.offpolicy analysis    # the planned analysis: results/offpolicy/offpolicy.*
    python -m studies.offpolicy one ...     # one real-model run (what the steps launch)

``--dry-run`` prints a step's commands only. Every step reuses what is finished.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studies.offpolicy import budget, one
from studies.offpolicy.analyze import analysis
from studies.offpolicy.design import TASK
from studies.offpolicy.real import MEASURED, arm, grid, pilot, rates, records, spent_s
from studies.offpolicy.tiny import tiny_grid, tiny_pilot

RUNS, RESULTS = Path("runs/offpolicy"), Path("results/offpolicy")


def show_budget(args: argparse.Namespace) -> int:
    """The time spent and the rule's forecast, from the measured estimates (the pilot's own run
    time once it has run): ``results/offpolicy/budget.md``."""
    wall = [r["wall_s"] for r in records(args.results, "pilot")]
    parts = budget.estimate(budget.measured(MEASURED), wall or None)
    spent = spent_s(args.runs)
    lines = ["# The off-policy study's budget", "",
             f"Spent: {spent / 3600:.2f} h of {budget.BUDGET_H:g} h (`{args.runs}`). Estimates: "
             + ("the pilot's mean run time" if wall else "the numbers measured before the plan")
             + " (`studies.offpolicy.budget.measured`); each row's estimate is for the whole part.",
             "", *budget.table(parts, spent)]  # fmt: skip
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "budget.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


STEPS = {"pilot": pilot, "rates": rates, "grid": grid, "tiny-pilot": tiny_pilot,
         "tiny-grid": tiny_grid, "arm": arm, "budget": show_budget, "analysis": analysis}  # fmt: skip


def main(argv: list[str]) -> int:
    if argv and argv[0] == "one":
        return one.main(argv[1:])
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m studies.offpolicy",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("step", choices=(*STEPS, "one"))
    p.add_argument("--task", default=TASK, help=f"the real model's task (default {TASK})")
    p.add_argument("--runs", type=Path, default=RUNS, help=f"the runs' folder (default {RUNS})")
    p.add_argument("--results", type=Path, default=RESULTS,
                   help=f"the committed results' folder (default {RESULTS})")  # fmt: skip
    p.add_argument("--workers", type=int, default=2, help="the tiny sweeps' worker processes")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = p.parse_args(argv)
    args.extra = extra  # after --: flags for every real-model run (the tests' tiny settings)
    return STEPS[args.step](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
