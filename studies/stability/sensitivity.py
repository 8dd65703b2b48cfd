"""The second study's rate-cell sensitivity (exploratory; docs/which_loss.md's erratum of
2026-12-04): the plan's tests again, on each rate cell alone.

    python -m studies.stability.sensitivity results/which-loss --out results/which-loss

The plan (docs/which_loss_plan.md) makes a seed's value its mean over the task's two rate cells,
the pilot's rate and twice it (the stress rate). That analysis stays the planned one; this one
asks how much of it each cell carries. From the committed grid records
(``<dir>/<task>/summary.json``) and the pilot's rates (``<dir>/pilot/pilot.json``), for three
selections of the records, *both cells* (the planned analysis, reproduced), *the pilot's rate
only* and *the stress rate only*, it runs the planned tests unchanged
(``studies.stability.which_loss.family``: the seed as the unit, the two-sided exact sign test,
Holm over the selection's 18 rows, the bootstrap interval) on the final reward and on the share
of failed runs. Beside them, from the same files: the variants that learned in the pilot at
each cell's rate, and each variant's mean clipped fraction per cell (``clipped_fraction_mean``:
the share of tokens whose gradient a clip removed; CISPO's, those whose weight its clamp
changed; SAPO has no clip). Writes ``sensitivity.md`` and
``sensitivity.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from studies.stability.which_loss import _test_rows, family

#: the selections of each task's records: name -> index into pilot.json's ``[rate, stress]``
#: (None: both cells, the planned analysis)
SELECTIONS = {"both cells (planned)": None, "pilot rate only": 0, "stress rate only": 1}
#: the significance level of the plan
ALPHA = 0.05


def select(
    by_task: dict[str, list[dict[str, Any]]], rates: dict[str, list[float | None]], cell: int | None
) -> dict[str, list[dict[str, Any]]]:
    """Each task's records of one rate cell (``cell`` 0: the pilot's rate, 1: the stress rate),
    or all of them (``cell`` None)."""
    if cell is None:
        return by_task
    return {t: [r for r in rs if r["lr"] == rates[t][cell]] for t, rs in by_task.items()}


def _cell(t: dict[str, Any]) -> str:
    """A summary cell: GMPO's wins/losses, Holm; the direction when significant against GMPO."""
    text = f"{t['wins']}/{t['losses']}, Holm {t['holm']:.4f}"
    if t["holm"] < ALPHA and t["losses"] > t["wins"]:
        text += " (the other higher)"
    elif t["ci"][1] < 0:
        text += " (interval below 0)"
    return text


def analyze(results: Path) -> tuple[dict[str, Any], list[str]]:
    """The tests of every selection over ``results``' task folders: ``(json, markdown lines)``."""
    pilot = json.loads((results / "pilot" / "pilot.json").read_text())
    rates = pilot["rates"]
    by_task = {t: json.loads((results / t / "summary.json").read_text()) for t in rates
               if (results / t / "summary.json").exists()}  # fmt: skip
    out: dict[str, Any] = {"rates": {t: rates[t] for t in by_task}, "selections": {}}
    for name, cell in SELECTIONS.items():
        chosen = select(by_task, rates, cell)
        out["selections"][name] = {"primary": family(chosen, "final_reward", +1),
                                   "failures": family(chosen, "failed", -1)}  # fmt: skip
    sel = out["selections"]
    first = next(iter(sel.values()))["primary"]
    lines = ["## Each test on each rate cell", "",
             "GMPO's wins/losses of the seeds on the final reward (a seed's value is its mean "
             "over the selection's cells), and the Holm-adjusted two-sided sign test over the "
             "selection's rows.", "",
             "| test | " + " | ".join(SELECTIONS) + " |", "|---|" + "---|" * len(SELECTIONS)]  # fmt: skip
    for test in first:
        lines.append(f"| {test} | " + " | ".join(_cell(sel[s]["primary"][test]) for s in sel)
                     + " |")  # fmt: skip
    lines += ["", "Failure comparisons significant after Holm (of "
              f"{len(next(iter(sel.values()))['failures'])}):", ""]  # fmt: skip
    for s, fam in sel.items():
        names = [n for n, t in fam["failures"].items() if t["holm"] < ALPHA]
        out["selections"][s]["failures_significant"] = names
        lines.append(f"- {s}: {len(names)}" + (f" ({', '.join(names)})" if names else ""))
    lines += ["", *learners(pilot, by_task), "", *clipped(by_task, rates)]
    for s, fam in sel.items():
        lines += ["", f"## {s}: final reward", "", *_test_rows(fam["primary"], "higher"),
                  "", f"## {s}: each seed's share of failed runs", "",
                  *_test_rows(fam["failures"], "fails less")]  # fmt: skip
    return out, lines


def learners(pilot: dict[str, Any], by_task: dict[str, Any]) -> list[str]:
    """Per task, the variants that learned in the pilot (pilot.json's ``learners``) at the rate
    and at the stress rate, of all the pilot's variants."""
    lines = ["## Who learned in the pilot at each cell's rate", "",
             "| task | rate | learned | stress rate | learned |", "|---|---:|---|---:|---|"]  # fmt: skip
    for t in by_task:
        o = pilot["tasks"][t]
        every = sorted({v for vs in o["learners"].values() for v in vs} | {
            g.split()[0] for g in o["gains"]})  # fmt: skip
        cells = []
        for lr in (o["rate"], o["stress"]):
            got = o["learners"].get(repr(lr), []) if lr is not None else []
            cells += ["—" if lr is None else f"{lr:g}",
                      f"{len(got)} of {len(every)}: {', '.join(got)}"]  # fmt: skip
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return lines


def clipped(by_task: dict[str, list[dict[str, Any]]], rates: dict[str, Any]) -> list[str]:
    """Per task and cell, each variant's mean over runs of its clipped fraction, in percent."""
    lines = ["## Clipped fraction per cell (mean over runs, % of tokens)", "",
             "The tokens whose gradient a clip removed (CISPO: whose weight its clamp changed; "
             "SAPO has no clip), averaged over each run's updates, then over the cell's runs.", "",
             "| task | lr | " + " | ".join(_variants(by_task)) + " |",
             "|---|---:|" + "---:|" * len(_variants(by_task))]  # fmt: skip
    for t, rs in by_task.items():
        for lr in [x for x in rates[t] if x is not None]:
            vals = []
            for v in _variants(by_task):
                xs = [r["clipped_fraction_mean"] for r in rs if r["variant"] == v and r["lr"] == lr]
                vals.append(f"{100 * statistics.fmean(xs):.1f}" if xs else "—")
            lines.append(f"| {t} | {lr:g} | " + " | ".join(vals) + " |")
    return lines


def _variants(by_task: dict[str, list[dict[str, Any]]]) -> list[str]:
    return list(dict.fromkeys(r["variant"] for rs in by_task.values() for r in rs))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.stability.sensitivity",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("results", type=Path, help="the second study's results folder")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    out, lines = analyze(args.results)
    head = ["# The second study's rate-cell sensitivity (exploratory)", "",
            f"Command: `python -m studies.stability.sensitivity {args.results} --out {args.out}`",
            "", "The planned tests (docs/which_loss_plan.md) on each rate cell alone, beside "
            "the planned analysis of both cells; from the committed grid records.", ""]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sensitivity.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "sensitivity.md").write_text("\n".join(head + lines) + "\n")
    print("\n".join(head + lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
