"""gmpo_stats.paired's two-sided sign test and bootstrap interval, by hand."""

from __future__ import annotations

import math
import statistics

import pytest

from gmpo_stats.paired import bootstrap_ci, seed_pairs, sign, sign_test_two_sided


def test_two_sided_sign_test_by_hand() -> None:
    # 9 wins, 1 loss: P(X >= 9) = (C(10,9) + C(10,10)) / 2^10 = 11 / 1024; two-sided 22 / 1024
    assert sign_test_two_sided(9, 1) == pytest.approx(22 / 1024)
    assert sign_test_two_sided(1, 9) == pytest.approx(22 / 1024)  # symmetric
    assert sign_test_two_sided(5, 5) == 1.0 and sign_test_two_sided(0, 0) == 1.0
    # 3 wins, 0 losses: 2 * 1/8
    assert sign_test_two_sided(3, 0) == pytest.approx(0.25)


def test_bootstrap_interval_is_seeded_and_brackets_the_mean() -> None:
    values = [0.1, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.25]
    lo, hi = bootstrap_ci(values)
    assert (lo, hi) == bootstrap_ci(values)  # the same interval every time
    assert lo < statistics.fmean(values) < hi
    assert min(values) <= lo and hi <= max(values)
    assert bootstrap_ci([0.5] * 6) == (0.5, 0.5)  # no spread: no width
    wide = bootstrap_ci(values, level=0.99)
    assert wide[0] <= lo and hi <= wide[1]
    assert all(math.isnan(x) for x in bootstrap_ci([]))


def test_seed_pairs_are_the_unit_of_the_sign_test() -> None:
    """Two cells a seed: the seed's mean over its cells is one pair."""
    records = [
        {"variant": m, "lr": lr, "grad_clip": None, "seed": s, "final_reward": f}
        for s, finals in enumerate([{"a": (0.9, 0.1), "b": (0.4, 0.4)},
                                    {"a": (0.5, 0.5), "b": (0.2, 0.3)}])
        for m, pair in finals.items()
        for lr, f in zip((1e-3, 2e-3), pair, strict=True)
    ]  # fmt: skip
    pairs = seed_pairs(records, "a", "b", "final_reward")
    assert pairs == [(pytest.approx(0.5), pytest.approx(0.4)), (0.5, pytest.approx(0.25))]
    assert sign(pairs)["wins"] == 2
