"""The second study's rate-cell sensitivity (studies/stability/sensitivity.py): each cell's
selection on made-up records, worked out by hand, and its planned selection against the
committed planned analysis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.stability import sensitivity

ROOT = Path(__file__).resolve().parents[2]


def _run(variant: str, lr: float, seed: int, final: float, start: float = 0.2) -> dict:
    return {"task": "t", "variant": variant, "lr": lr, "grad_clip": None, "seed": seed,
            "final_reward": final, "start_reward": start, "failed": final < start,
            "clipped_fraction_mean": 0.01 if variant == "gmpo" else 0.2}  # fmt: skip


def _results(tmp_path: Path) -> Path:
    # 8 seeds; at the rate (1e-3) grpo ends higher than gmpo on every seed (0.5 vs 0.6); at the
    # stress rate (2e-3) gmpo ends higher (0.5) and grpo fails (0.1, below its 0.2 start)
    records = []
    for s in range(8):
        records += [_run("gmpo", 1e-3, s, 0.5), _run("grpo", 1e-3, s, 0.6),
                    _run("gmpo", 2e-3, s, 0.5), _run("grpo", 2e-3, s, 0.1)]  # fmt: skip
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "summary.json").write_text(json.dumps(records))
    (tmp_path / "pilot").mkdir()
    pilot = {"rates": {"t": [1e-3, 2e-3]},
             "tasks": {"t": {"rate": 1e-3, "stress": 2e-3,
                             "learners": {"0.001": ["gmpo", "grpo"], "0.002": ["gmpo"]},
                             "gains": {"gmpo 0.001": 0.3, "grpo 0.001": 0.4}}}}  # fmt: skip
    (tmp_path / "pilot" / "pilot.json").write_text(json.dumps(pilot))
    return tmp_path


def test_each_cell_alone_and_both(tmp_path: Path) -> None:
    out, lines = sensitivity.analyze(_results(tmp_path))
    sel = out["selections"]
    both = sel["both cells (planned)"]["primary"]["t: gmpo vs grpo"]
    rate = sel["pilot rate only"]["primary"]["t: gmpo vs grpo"]
    stress = sel["stress rate only"]["primary"]["t: gmpo vs grpo"]
    # both: the seed's mean, 0.5 against 0.35: GMPO higher on all 8, mean difference 0.15
    assert (both["wins"], both["losses"], both["mean_diff"]) == (8, 0, pytest.approx(0.15))
    # the rate alone: GRPO higher on all 8 (2 * 2^-8 = 1/128, one test: Holm the same)
    assert (rate["wins"], rate["losses"]) == (0, 8)
    assert rate["holm"] == pytest.approx(1 / 128) and rate["mean_diff"] == pytest.approx(-0.1)
    assert (stress["wins"], stress["losses"], stress["mean_diff"]) == (8, 0, pytest.approx(0.4))
    # failures: grpo fails at the stress rate only
    assert sel["pilot rate only"]["failures_significant"] == []
    assert sel["stress rate only"]["failures_significant"] == ["t: gmpo vs grpo"]
    text = "\n".join(lines)
    assert "| t: gmpo vs grpo | 8/0, Holm 0.0078 | 0/8, Holm 0.0078 (the other higher) |" in text
    assert "| t | 0.001 | 2 of 2: gmpo, grpo | 0.002 | 1 of 2: gmpo |" in text
    assert "| t | 0.002 | 1.0 | 20.0 |" in text  # the clipped fractions in percent


def test_the_planned_selection_reproduces_the_committed_analysis() -> None:
    """On the committed grid records, the selection of both cells is the planned analysis:
    every row of results/which-loss/which_loss.json, Holm included."""
    results = ROOT / "results" / "which-loss"
    planned = json.loads((results / "which_loss.json").read_text())
    out, _ = sensitivity.analyze(results)
    both = out["selections"]["both cells (planned)"]
    for family in ("primary", "failures"):
        assert list(both[family]) == list(planned[family])
        for name, row in planned[family].items():
            got = both[family][name]
            for key in ("seeds", "wins", "losses", "ties"):
                assert got[key] == row[key], (family, name, key)
            for key in ("p", "holm", "mean_diff"):
                assert got[key] == pytest.approx(row[key], rel=1e-12), (family, name, key)
            assert got["ci"] == pytest.approx(row["ci"], rel=1e-12)
