"""docs/offpolicy_plan.md states the design's numbers (seeds, ladder, the MDE's factor) and the
budget's estimate as studies/offpolicy computes them."""

from __future__ import annotations

from pathlib import Path

from studies.offpolicy import budget
from studies.offpolicy import design as d

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_page_states_the_designs_numbers() -> None:
    page = (ROOT / "docs/offpolicy_plan.md").read_text()
    for s in (d.PILOT_SEEDS, d.TINY_PILOT_SEEDS):
        assert ", ".join(map(str, s)) in page
    for s in (d.GRID_SEEDS, d.SPARE_SEEDS, d.TINY_GRID_SEEDS):
        assert f"{s[0]} to {s[-1]}" in page
    assert ", ".join(f"{lr:g}" for lr in d.LADDER) in page
    assert f"z(p*) = {d.mde(1.0, 12):.3f}" in page and "p* = 0.8693" in page


def test_the_plan_pages_budget_table_is_the_estimate() -> None:
    page = (ROOT / "docs/offpolicy_plan.md").read_text()
    rows = budget.table(budget.estimate(budget.measured(ROOT / "results")))
    assert "\n".join(rows) in page
