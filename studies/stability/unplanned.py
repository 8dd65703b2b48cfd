"""What the confirmatory analysis reports beside the plan (``confirm.md``, "Beside the plan").

None of it was fixed before the runs, and none of it changes a planned result; it says what
the planned tables leave open:

* **scope**: each task's model and run, from the setup its sweep recorded (``summary.md``);
* **by seed**: the primary comparisons with the seed as the unit (the cells of a seed share its
  warm start and prompts, so its two run pairs are not independent): a seed's final reward is
  its mean over the cells, and its failures the share of its runs that failed;
* **by cell**: each cell alone, the run pairs' sign test and McNemar test, not adjusted;
* **mechanism over all steps**: the planned steps-1-20 sign tests on the all-steps values, which
  the plan reports only as means (after a failure a run's values are those of a dead policy);
* **warm starts**: how many begin below :data:`LOW`, where most groups hold no right completion
  and so give no gradient, and how many runs of each task failed.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from gmpo_stats.paired import cell_of, holm, mcnemar, pairs, seed_pairs, sign
from gmpo_tasks.task import CELL
from studies.stability.run import Setup

#: a warm-start reward below this leaves most groups of a step without a right completion
LOW = 0.05
#: (name, first method, second method), the first expected higher (confirm.COMPARISONS)
Comparison = tuple[str, str, str]


def setups(dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """Each task's run setup as its sweep's ``summary.md`` records it (``Setup: `{...}` ``)."""
    out = {}
    for d in dirs:
        if not (d / "summary.md").is_file():
            continue
        m = re.search(r"^Setup: `(\{.*?\})`", (d / "summary.md").read_text(), re.M)
        if m is not None:
            setup = json.loads(m.group(1))
            out[setup["task_name"]] = setup
    return out


def scope(setup: dict[str, Any]) -> dict[str, Any]:
    """The model and run of one task's setup: parameters counted on the model it builds."""
    s = Setup(**setup)
    model = s.model()
    return {"task": s.task_name, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab": model.tok.num_embeddings, "layers": s.layers, "d": s.d, "heads": s.heads,
            "tied": s.tied, "prompt_tokens": s.task.prompt_length,
            "answer_tokens": s.task.answer_length, "completions": s.prompts * s.group,
            "group": s.group, "updates": s.minibatches * s.epochs, "steps": s.steps}  # fmt: skip


def _tested(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row, adj in zip(rows, holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = adj
    return rows


def analyse(records: list[dict[str, Any]], comparisons: tuple[Comparison, ...],
            mechanism: tuple[tuple[str, int], ...], mechanism_comparisons: tuple[str, ...],
            group: int = CELL.group) -> dict[str, Any]:  # fmt: skip
    """The tables beside the plan (see the module docstring) on a sweep's run records."""
    tasks = sorted({r["task"] for r in records}, key=lambda t: (t != "reverse", t))
    out: dict[str, Any] = {"by_seed": [], "by_seed_failures": [], "by_cell": [],
                           "mechanism_all": [], "warm_starts": []}  # fmt: skip
    for task in tasks:
        rs = [r for r in records if r["task"] == task]
        for name, a, b in comparisons:
            head = {"task": task, "comparison": name, "a": a, "b": b}
            finals = seed_pairs(rs, a, b, "final_reward")
            out["by_seed"].append({**head, "seeds": len(finals), **sign(finals)})
            out["by_seed_failures"].append({**head, **sign(seed_pairs(rs, a, b, "failed"), -1)})
            for lr, clip in sorted(
                {cell_of(r) for r in rs}, key=lambda c: (c[0], -1 if c[1] is None else c[1])
            ):
                cell = [r for r in rs if cell_of(r) == (lr, clip)]
                fails = mcnemar(pairs(cell, a, b, "failed"))
                out["by_cell"].append({**head, "lr": lr, "grad_clip": clip,
                                       **sign(pairs(cell, a, b, "final_reward")),
                                       **{f"failures_{k}": v for k, v in fails.items()}})  # fmt: skip
            if name in mechanism_comparisons:
                for metric, direction in mechanism:
                    values = pairs(rs, a, b, f"{metric}_all")
                    out["mechanism_all"].append({**head, "metric": metric, "direction": direction,
                                                 **sign(values, direction)})  # fmt: skip
        starts = sorted({r["seed"]: r["start_reward"] for r in rs}.values())
        low = [s for s in starts if s < LOW]
        out["warm_starts"].append({
            "task": task, "seeds": len(starts), "min": starts[0],
            "median": statistics.median(starts), "max": starts[-1], "below": len(low),
            "no_right_completion": statistics.fmean((1 - s) ** group for s in low) if low else None,
            "group": group, "failed": sum(r["failed"] for r in rs), "runs": len(rs)})  # fmt: skip
    for family in ("by_seed", "by_seed_failures", "mechanism_all"):
        _tested(out[family])
    return out


def _cmp(r: dict[str, Any], sep: str = ">") -> str:
    return f"{r['comparison']} {r['a']} {sep} {r['b']}"


def report(out: dict[str, Any], scopes: list[dict[str, Any]]) -> list[str]:
    """The "Beside the plan" section of ``confirm.md``."""
    lines = ["", "## Beside the plan", "",
             "Not in the plan: added after the results were seen. No planned result above changes.",
             ""]  # fmt: skip
    if scopes:
        lines += ["### Scope", "",
                  "| task | parameters | vocabulary | layers x width (heads) | prompt tokens "
                  "| answer tokens (every answer) | completions a step (group) | updates a batch "
                  "| RL steps | KL term | device |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|",
                  *(f"| {s['task']} | {s['parameters']:,} | {s['vocab']} | {s['layers']} x {s['d']} "
                    f"({s['heads']}) | {s['prompt_tokens']} | {s['answer_tokens']} | "
                    f"{s['completions']} ({s['group']}) | {s['updates']} | {s['steps']} | none "
                    "| CPU |" for s in scopes), ""]  # fmt: skip
    lines += ["### The seed as the unit", "",
              "A seed's final reward: the mean of its runs' final rewards over the two cells; one "
              "pair a seed. Holm over the six, as the plan's primary family.", "",
              "| task | comparison | seeds | wins | losses | ties | p (one-sided) | p (Holm, 6) |",
              "|---|---|---:|---:|---:|---:|---:|---:|",
              *(f"| {r['task']} | {_cmp(r)} | {r['seeds']} | {r['wins']} | {r['losses']} | "
                f"{r['ties']} | {r['p']:.4f} | {r['p_holm']:.4f} |" for r in out["by_seed"]), "",
              "A seed's failures: the share of its runs that failed; a win when the first "
              "method's share is lower.", "",
              "| task | comparison | fewer failed | more failed | same | p (one-sided) | p (Holm, 6) |",
              "|---|---|---:|---:|---:|---:|---:|",
              *(f"| {r['task']} | {_cmp(r, 'vs')} | {r['wins']} | {r['losses']} | {r['ties']} | "
                f"{r['p']:.4f} | {r['p_holm']:.4f} |" for r in out["by_seed_failures"]), "",
              "### Each cell alone (not adjusted)", "",
              "| task | lr | grad clip | comparison | wins | losses | ties | p (one-sided) "
              "| only the second failed | only the first failed | p (McNemar) |",
              "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
              *(f"| {r['task']} | {r['lr']:g} | {r['grad_clip'] if r['grad_clip'] is not None else 'none'} "
                f"| {_cmp(r)} | {r['wins']} | {r['losses']} | {r['ties']} | {r['p']:.4f} | "
                f"{r['failures_better']} | {r['failures_worse']} | {r['failures_p']:.4f} |"
                for r in out["by_cell"]), "",
              "### Mechanism over all steps, sign tests in the paper's direction (Holm over 8)", "",
              "A run that has fallen to a reward near 0 adds steps in which most groups hold no "
              "right completion and so give little or no gradient: these values mix the "
              "mechanism with the failures (the plan tests steps 1-20 for that reason).", "",
              "| task | comparison | metric | predicted for the first | wins | losses | ties | p | p (Holm) |",
              "|---|---|---|---|---:|---:|---:|---:|---:|",
              *(f"| {r['task']} | {_cmp(r, 'vs')} | {r['metric']} | "
                f"{'lower' if r['direction'] < 0 else 'higher'} | {r['wins']} | {r['losses']} | "
                f"{r['ties']} | {r['p']:.4f} | {r['p_holm']:.4f} |" for r in out["mechanism_all"]), "",
              "### Warm starts and failed runs", "",
              "A group whose completions are all wrong has every advantage 0 and gives no "
              "gradient; at a sampled reward r, a group of G completions is all wrong with "
              "probability (1 - r)^G.", "",
              f"| task | seeds | warm start: min | median | max | below {LOW} | G | groups all "
              "wrong at those (expected) | failed runs |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
              *(f"| {r['task']} | {r['seeds']} | {r['min']:.3f} | {r['median']:.3f} | "
                f"{r['max']:.3f} | {r['below']} | {r['group']} | "
                f"{'—' if r['no_right_completion'] is None else format(r['no_right_completion'], '.2f')} "
                f"| {r['failed']}/{r['runs']} |" for r in out["warm_starts"]), ""]  # fmt: skip
    return lines
