"""The regime study's budget rule (docs/regime_plan.md, "Budget"; ``updates budget``): the
wall-clock spent so far, then the parts left added up in the order they run, as the plan's
table is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studies.stability import updates
from studies.stability import updates_plan as plan


def test_the_budget_step_applies_the_plans_rule(tmp_path: Path, capsys: Any) -> None:
    runs, results = tmp_path / "runs", tmp_path / "results"
    for where, wall in (("pilot/reverse/u1", 3 * 3600), ("reverse/u1", 2 * 3600),
                        ("timing/reverse/u1", 99 * 3600)):  # fmt: skip
        (runs / where).mkdir(parents=True)
        (runs / where / "invocations.jsonl").write_text(json.dumps({"wall_s": wall}) + "\n")
    # 5 h spent: the primary tasks' pilot and grid (4 h) are never dropped, their robustness
    # cells (2.5 h) fit in 8 h, chain_sum (3.5 h) does not, and its robustness cells (0.5 h)
    # go with it
    parts = [{"step": "grid", "task": t, "runs": 1, "wall_s": 2 * 3600} for t in plan.TASKS]
    parts += [
        {"step": "robustness", "task": t, "runs": 1, "wall_s": 1.25 * 3600} for t in plan.TASKS
    ]
    parts += [{"step": "grid", "task": "chain_sum", "runs": 1, "wall_s": 3.5 * 3600}]
    parts += [{"step": "robustness", "task": "chain_sum", "runs": 1, "wall_s": 0.5 * 3600}]
    results.mkdir()
    (results / "timing.json").write_text(json.dumps({"estimate": parts}))
    updates.main(["budget", "--runs", str(runs), "--results", str(results)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("spent: 5.00 h of the budget's 8 h")  # the timing's 99 h apart
    assert out[1].endswith("estimate 4.00 h: ran, in the spent time (never dropped: the plan)")
    assert out[2].endswith("estimate 2.50 h; spent + the parts to here 7.50 h: fits")
    assert out[3].endswith("estimate 3.50 h; spent + the parts to here 11.00 h: does not fit: "
                           "dropped, with every later part")  # fmt: skip
    assert out[4].endswith("estimate 0.50 h: dropped, as an earlier part was")


def budget_lines(tmp_path: Path, capsys: Any, spent_h: float, *argv: str) -> list[str]:
    """``updates budget`` with ``spent_h`` hours spent and the plan's table as the estimate
    (docs/regime_plan.md, "Budget": 4.40, 1.58, 1.19 and 0.42 h)."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    (runs / "reverse" / "u1").mkdir(parents=True)
    (runs / "reverse" / "u1" / "invocations.jsonl").write_text(
        json.dumps({"wall_s": spent_h * 3600}) + "\n"
    )
    steps = {"pilot and grid": "grid", "robustness": "robustness"}
    table = [(plan.TASKS[0], "pilot and grid", 4.40), (plan.TASKS[0], "robustness", 1.58),
             (plan.EXTRA_TASK, "pilot and grid", 1.19), (plan.EXTRA_TASK, "robustness", 0.42)]  # fmt: skip
    estimate = [{"step": steps[part], "task": task, "runs": 1, "wall_s": h * 3600}
                for task, part, h in table]  # fmt: skip
    results.mkdir()
    (results / "timing.json").write_text(json.dumps({"estimate": estimate}))
    updates.main(["budget", "--runs", str(runs), "--results", str(results), *argv])
    return capsys.readouterr().out.splitlines()


def test_the_budget_adds_the_parts_in_the_order_they_run(tmp_path: Path, capsys: Any) -> None:
    """With 6.0 h spent, each part left was judged alone (6.0 + 1.19 and
    6.0 + 0.42 "fit") though, run in order, they come to 9.19 h of the 8. The plan's table is
    cumulative, and so is the check: after the primary robustness cells (7.58 h), chain_sum
    (8.77 h) no longer fits."""
    out = budget_lines(tmp_path, capsys, 6.0)
    assert out[2].endswith("estimate 1.58 h; spent + the parts to here 7.58 h: fits")
    assert out[3].endswith("estimate 1.19 h; spent + the parts to here 8.77 h: does not fit: "
                           "dropped, with every later part")  # fmt: skip
    assert out[4].endswith("estimate 0.42 h: dropped, as an earlier part was")
    assert sum("fits" in line for line in out) == 1


def test_the_budget_before_a_later_part(tmp_path: Path, capsys: Any) -> None:
    """``--next 3``, before chain_sum: the primary robustness cells ran and are in the spent
    time; chain_sum's two parts are added from there (6.0 + 1.19 + 0.42 = 7.61 h)."""
    out = budget_lines(tmp_path, capsys, 6.0, "--next", "3")
    assert out[2].endswith("estimate 1.58 h: ran, in the spent time")
    assert out[3].endswith("estimate 1.19 h; spent + the parts to here 7.19 h: fits")
    assert out[4].endswith("estimate 0.42 h; spent + the parts to here 7.61 h: fits")
