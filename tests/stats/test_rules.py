"""gmpo_stats: the collapse rule and the sign test of docs/study.md, on made-up curves and
hand-worked values (the study's tables and ``gmpo compare``'s summary both read them)."""

from __future__ import annotations

import pytest

from gmpo_stats.outcome import collapse
from gmpo_stats.paired import paired, pooled, sign_test_p


def test_collapse_rule_on_a_made_up_curve() -> None:
    # 20 steps at 0.2, 30 at 0.9, 50 at 0.5: the best 20-step mean is 0.9 (inside the plateau),
    # the final 20-step mean 0.5; 0.9 - 0.5 = 0.4 >= 0.3: collapsed
    curve = [0.2] * 20 + [0.9] * 30 + [0.5] * 50
    c = collapse(curve)
    assert (c.final, c.peak, c.collapsed) == (pytest.approx(0.5), pytest.approx(0.9), True)
    # ending at 0.65 is 0.25 below the peak: not collapsed
    assert not collapse([0.2] * 20 + [0.9] * 30 + [0.65] * 50).collapsed
    # exactly 0.3 below counts (at least 0.3)
    assert collapse([0.8] * 20 + [0.5] * 20).collapsed
    # a peak shorter than the window is averaged with its neighbours: 10 steps at 1.0 amid 0.4
    # give a best window of (10 * 1.0 + 10 * 0.4) / 20 = 0.7, 0.3 above the final 0.4
    spike = [0.4] * 30 + [1.0] * 10 + [0.4] * 30
    assert collapse(spike).peak == pytest.approx(0.7) and collapse(spike).collapsed
    # a rising run never collapses; a short curve is its own window
    assert not collapse([i / 100 for i in range(100)]).collapsed
    assert collapse([0.9, 0.1], window=20).final == pytest.approx(0.5)
    with pytest.raises(ValueError):
        collapse([])


def test_sign_test_against_a_value_worked_out_by_hand() -> None:
    # 7 wins, 1 loss: P(X >= 7), X ~ Bin(8, 1/2) = (C(8,7) + C(8,8)) / 2^8 = (8 + 1) / 256
    assert sign_test_p(7, 1) == pytest.approx(9 / 256)
    # 5 wins, 0 losses: 1 / 32; no pairs: p = 1
    assert sign_test_p(5, 0) == pytest.approx(1 / 32)
    assert sign_test_p(0, 0) == 1.0


def test_pairs_are_matched_on_seed_and_cell_and_ties_dropped() -> None:
    def rec(method: str, lr: float, clip: float | None, seed: int, final: float) -> dict:
        return {"variant": method, "lr": lr, "grad_clip": clip, "seed": seed,
                "final_reward": final}  # fmt: skip

    records = [
        rec("gmpo", 1e-3, None, 0, 0.9), rec("grpo", 1e-3, None, 0, 0.1),  # win
        rec("gmpo", 1e-3, None, 1, 0.2), rec("grpo", 1e-3, None, 1, 0.3),  # loss
        rec("gmpo", 1e-3, 1.0, 0, 0.0), rec("grpo", 1e-3, 1.0, 0, 0.0),  # tie
        rec("gmpo", 1e-3, 1.0, 1, 0.5), rec("grpo", 1e-3, 1.0, 2, 0.1),  # no pair: other seeds
        rec("gmpo_noclip", 1e-3, None, 0, 0.0),
    ]  # fmt: skip
    per_cell = paired(records, "gmpo", "grpo")
    assert per_cell == {(1e-3, None): (1, 1, 0), (1e-3, 1.0): (0, 0, 1)}
    assert pooled(per_cell) == (1, 1, 1) and pooled(per_cell).p == pytest.approx(0.75)
