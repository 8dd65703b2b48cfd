"""The regime study (docs/regime_plan.md): GMPO against the losses users run at 1, 2, 4 and 16
updates per generation batch, each loss at its own learning rate.

    python -m studies.stability.updates timing            # one run per regime and task
    python -m studies.stability.updates pilot             # the pilot, then its rule
    python -m studies.stability.updates grid              # the grid at the pilot's rates
    python -m studies.stability.updates grid --robustness # then each loss at twice its rate
    python -m studies.stability.updates analysis          # the planned analysis
    python -m studies.stability.updates budget            # spent, and what still fits
    python -m studies.stability.updates budget --next 3   # ... before the plan's third part
    python -m studies.stability.updates real              # the real-model cross-check

Every rule here is the plan's, fixed before its pilot ran. Each step runs the study's sweep
(``python -m studies.stability``, one invocation per task and regime, printed before it runs;
``--dry-run`` prints them only) and copies each sweep's ``summary.md``, ``summary.json`` (as
``summary.json.gz``) and ``invocations.jsonl`` from ``--runs`` into ``--results``:

- the regime is ``--setup minibatches=M,epochs=E`` (:data:`REGIMES`: updates = M x E, as TRL
  counts ``steps_per_generation / gradient_accumulation_steps`` x ``num_iterations`` and verl
  mini-batches x ``ppo_epochs``);
- the pilot runs every loss of :data:`LOSSES` at every rate of :data:`LADDER` on the pilot
  seeds; :func:`pick` chooses each loss's rate per task and regime (the highest median final
  reward), once extended past the ladder's edge where the pick sits on it (:func:`extension`);
- the grid runs each loss at its own rate on the grid seeds (``--cells``), at 1 update also
  ``grpo`` at ``gmpo``'s rate (the sanity row), and with ``--robustness`` each loss at twice its
  rate (a secondary cell, run after every primary cell);
- the analysis (:mod:`studies.stability.updates_analysis`) tests GMPO against each other loss
  per task and regime, the seed as the unit, and gives each row the plan's verdict; the timing
  and the budget's estimate are :mod:`studies.stability.updates_timing`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from studies.stability.updates_analysis import analysis
from studies.stability.updates_plan import (
    EXTEND,
    EXTRA_TASK,
    GRID_SEEDS,
    LADDER,
    LOSSES,
    PILOT_SEEDS,
    REGIMES,
    RESULTS,
    RUNS,
    TASKS,
    copy_summaries,
    extension,
    pick,
    records_of,
    regime_name,
    run_sweep,
    share_warm,
    sweep_argv,
)
from studies.stability.updates_real import real
from studies.stability.updates_timing import budget, timing
from studies.stability.which_loss import GMPO


def pilot(args: argparse.Namespace) -> int:
    """Every loss at every rate of the ladder on the pilot seeds, each task and regime; the
    extension where a pick sits on the ladder's edge; the rule into ``pilot.json``."""
    ladder_cells = [(v, lr) for lr in LADDER for v in LOSSES]
    outcome: dict[str, Any] = {"ladder": list(LADDER), "seeds": list(PILOT_SEEDS), "tasks": {}}
    for task in args.tasks:
        for u in REGIMES:
            out = args.runs / "pilot" / task / regime_name(u)
            if not args.dry_run:
                share_warm(out)
            run_sweep(
                sweep_argv(task, u, ladder_cells, PILOT_SEEDS, out, args.workers, 2e-3),
                args.dry_run,
            )
            if args.dry_run:
                continue
            cells = list(ladder_cells)
            for _ in range(EXTEND):  # the same sweep with the extension's cells: the rest reused
                more = extension(records_of(out))
                if not more:
                    break
                cells += more
                run_sweep(sweep_argv(task, u, cells, PILOT_SEEDS, out, args.workers, 2e-3),
                     args.dry_run)  # fmt: skip
            outcome["tasks"].setdefault(task, {})[regime_name(u)] = pick(records_of(out))
            copy_summaries(out, args.results / "pilot" / task / regime_name(u))
    if args.dry_run:
        return 0
    path = args.results / "pilot" / "pilot.json"
    if path.exists():  # chain_sum's pilot after the primary tasks': keep theirs
        outcome["tasks"] = {**json.loads(path.read_text())["tasks"], **outcome["tasks"]}
    path.write_text(json.dumps(outcome, indent=1) + "\n")
    (args.results / "pilot" / "pilot.md").write_text("\n".join(pilot_table(outcome)) + "\n")
    print("\n".join(pilot_table(outcome)))
    return 0


def pilot_table(outcome: dict[str, Any]) -> list[str]:
    """Markdown: each loss's chosen rate per task and regime, and every median it was chosen
    from."""
    lines = ["# The regime study's pilot: each loss's rate per task and regime", "",
             "The rule (docs/regime_plan.md): the rate with the highest median final reward over "
             f"the pilot seeds {', '.join(map(str, outcome['seeds']))} (the lower on a tie); "
             "*edge*: the pick is the lowest or highest rate the loss ran.", ""]  # fmt: skip
    for task, by_regime in outcome["tasks"].items():
        lines += [f"## {task}", "", "| loss | " + " | ".join(
            f"{k[1:]} update{'s' * (k != 'u1')}" for k in by_regime) + " |",
            "|---|" + "---:|" * len(by_regime)]  # fmt: skip
        for v in LOSSES:
            cells = []
            for o in by_regime.values():
                rate = o["rates"].get(v)
                cells.append("—" if rate is None else f"{rate:g}"
                             + (f" (edge, {o['edge'][v]})" if v in o["edge"] else ""))  # fmt: skip
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        lines += ["", "Median final reward per rate:", ""]
        for k, o in by_regime.items():
            rates = sorted({float(lr) for d in o["medians"].values() for lr in d})
            lines += [f"### {task}, {k[1:]} update{'s' * (k != 'u1')}", "",
                      "| loss | " + " | ".join(f"lr {lr:g}" for lr in rates) + " |",
                      "|---|" + "---:|" * len(rates)]  # fmt: skip
            for v, d in o["medians"].items():
                vals = [d.get(repr(lr)) for lr in rates]
                lines.append(f"| {v} | " + " | ".join(
                    "—" if x is None else (f"**{x:.3f}**" if lr == o["rates"][v] else f"{x:.3f}")
                    for x, lr in zip(vals, rates, strict=True)) + " |")  # fmt: skip
            lines.append("")
    return lines


def grid_cells(rates: dict[str, float], updates: int, robustness: bool) -> list[Any]:
    """The grid's (loss, rate) cells of one task and regime: each loss at its own rate; at 1
    update also ``grpo`` at ``gmpo``'s rate (the sanity row); with ``robustness`` each loss at
    twice its rate too."""
    cells = [(v, rates[v]) for v in LOSSES]
    if updates == 1 and (("grpo", rates[GMPO]) not in cells):
        cells.append(("grpo", rates[GMPO]))
    if robustness:
        cells += [(v, 2 * rates[v]) for v in LOSSES if (v, 2 * rates[v]) not in cells]
    return cells


def grid(args: argparse.Namespace) -> int:
    """Each task's and regime's grid at the pilot's rates (task after task, the primary cells
    of every regime first); with ``--robustness``, then the cells at twice each rate."""
    outcome = json.loads((args.results / "pilot" / "pilot.json").read_text())
    for robust in (False, True) if args.robustness else (False,):
        for task in args.tasks:
            for u in REGIMES:
                rates = outcome["tasks"][task][regime_name(u)]["rates"]
                out = args.runs / task / regime_name(u)
                if not args.dry_run:
                    share_warm(out)
                cells = grid_cells(rates, u, robust)
                run_sweep(sweep_argv(task, u, cells, GRID_SEEDS, out, args.workers, rates[GMPO]),
                     args.dry_run)  # fmt: skip
                if not args.dry_run:
                    copy_summaries(out, args.results / task / regime_name(u))
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.stability.updates",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("step", choices=("timing", "pilot", "grid", "analysis", "budget", "real"))
    p.add_argument("--tasks", default=",".join(TASKS),
                   help=f"comma list (default {','.join(TASKS)}; {EXTRA_TASK} if the budget allows)")  # fmt: skip
    p.add_argument("--runs", type=Path, default=RUNS, help=f"the sweeps' folder (default {RUNS})")
    p.add_argument("--results", type=Path, default=RESULTS,
                   help=f"the committed results' folder (default {RESULTS})")  # fmt: skip
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--robustness", action="store_true", help="grid: then each loss at 2x its rate")
    p.add_argument("--dry-run", action="store_true", help="print the sweeps' commands only")
    p.add_argument("--next", type=int, default=2,
                   help="budget: the part about to run, its row in the plan's table (default 2: "
                        "the first after the primary pilot and grid)")  # fmt: skip
    p.add_argument("--gmpo", default=str(Path(sys.executable).parent / "gmpo"),
                   help="real: the gmpo command (default: beside this Python)")  # fmt: skip
    args = p.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    steps = {"timing": timing, "pilot": pilot, "grid": grid, "analysis": analysis, "budget": budget,
             "real": real}  # fmt: skip
    return steps[args.step](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
