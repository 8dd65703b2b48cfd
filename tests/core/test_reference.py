"""Tests of the float64 NumPy reference on its own (no torch).

Hand-worked cases carry their arithmetic in comments; the closed-form gradient is checked against
central finite differences away from the clip boundaries.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from gmpo_core import reference

NAN, INF = math.nan, math.inf
EXACT = 1e-12  # hand cases: only float64 rounding separates the two sides


def _two_row_case() -> dict[str, Any]:
    """Row 0: A = +1, two valid tokens, r = [0.1, 0.6], NaN in the padding.
    Row 1: A = -2, three valid tokens, r = [-0.5, 0.2, 0.0].
    """
    return {
        "logp": np.array([[-0.9, -1.4, NAN], [-1.5, -1.3, -0.5]]),
        "old_logp": np.array([[-1.0, -2.0, INF], [-1.0, -1.5, -0.5]]),
        "advantages": np.array([1.0, -2.0]),
        "mask": np.array([[1, 1, 0], [1, 1, 1]]),
    }


# --------------------------------------------------------------------------- hand cases


def test_hand_case_two_rows() -> None:
    out = reference.gmpo_loss(**_two_row_case())  # epsilon = 0.4 on both sides
    # Row 0 (A = +1): c = [min(0.1, 0.4), min(0.6, 0.4)] = [0.1, 0.4]; log_coef = 0.5 / 2 = 0.25;
    #   loss_0 = -1 * exp(0.25).  Token 1 is clipped (0.6 > 0.4).
    # Row 1 (A = -2): c = [max(-0.5, -0.4), 0.2, 0.0] = [-0.4, 0.2, 0.0]; log_coef = -0.2 / 3;
    #   loss_1 = 2 * exp(-1/15).  Token 0 is clipped (-0.5 < -0.4).
    loss0, loss1 = -math.exp(0.25), 2 * math.exp(-1 / 15)
    np.testing.assert_allclose(out.log_coef, [0.25, -1 / 15], rtol=0, atol=EXACT)
    np.testing.assert_allclose(out.per_sequence_loss, [loss0, loss1], rtol=0, atol=EXACT)
    assert out.loss == pytest.approx((loss0 + loss1) / 2, abs=EXACT)
    # grad = (1/B) * -A * exp(log_coef) / n * u, B = 2:
    #   row 0: -1 * exp(0.25) / 2 / 2 = -exp(0.25)/4 on token 0; clipped token 1 and pad: 0.
    #   row 1: +2 * exp(-1/15) / 3 / 2 = exp(-1/15)/3 on tokens 1, 2; clipped token 0: 0.
    g0, g1 = -math.exp(0.25) / 4, math.exp(-1 / 15) / 3
    np.testing.assert_allclose(out.grad_logp, [[g0, 0, 0], [0, g1, g1]], rtol=0, atol=EXACT)
    # 5 valid tokens; one low clip (row 1), one high clip (row 0).
    assert out.stats["num_tokens"] == 5
    assert out.stats["num_clipped_low"] == 1
    assert out.stats["num_clipped_high"] == 1
    assert out.stats["num_clipped_dual"] == 0
    np.testing.assert_allclose(out.stats["row_clip_low"], [0, 1 / 3], rtol=0, atol=EXACT)
    np.testing.assert_allclose(out.stats["row_clip_high"], [1 / 2, 0], rtol=0, atol=EXACT)
    assert out.stats["log_ratio_min"] == pytest.approx(-0.5, abs=EXACT)
    assert out.stats["log_ratio_max"] == pytest.approx(0.6, abs=EXACT)
    assert "kl_sum" not in out.stats
    expected = {
        "clip_ratio/low_mean": 1 / 5,
        "clip_ratio/high_mean": 1 / 5,
        "clip_ratio/region_mean": 2 / 5,
        "clip_ratio/low_min": 0.0,  # row 0 has no low clip
        "clip_ratio/high_max": 1 / 2,  # row 0: one of two tokens
        "log_ratio/min": -0.5,
        "log_ratio/max": 0.6,
    }
    assert out.metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert out.metrics[key] == pytest.approx(value, abs=EXACT), key


def test_on_policy_gradient_is_grpo_token_mean() -> None:
    # docs/semantics.md S10: old_logp = None means r = 0, so c = 0, log_coef = 0, exp = 1 and
    # per_sequence_loss = -A; grad = -A / (n * B) on every valid token.
    logp = np.array([[-0.3, -2.0, -1.1, -4.0], [-0.7, -0.2, NAN, NAN], [-1.0, -1.0, -1.0, -1.0]])
    adv = np.array([0.5, -1.5, 2.0])
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]])
    out = reference.gmpo_loss(logp, None, adv, mask)
    # row 0: -0.5/(4*3); row 1: 1.5/(2*3) = 0.25; row 2: -2/(2*3) = -1/3.
    expected = [
        [-0.5 / 12] * 4,
        [0.25, 0.25, 0, 0],
        [-1 / 3, 0, -1 / 3, 0],
    ]
    np.testing.assert_allclose(out.grad_logp, expected, rtol=0, atol=EXACT)
    np.testing.assert_allclose(out.per_sequence_loss, -adv, rtol=0, atol=EXACT)
    assert out.loss == pytest.approx((-0.5 + 1.5 - 2.0) / 3, abs=EXACT)


def test_token_exactly_on_the_bound_is_not_clipped() -> None:
    # epsilon = 0.5 and r = ±0.5 exactly (binary fractions, so no rounding):
    # row 0 (A = +1): r = [0.5, 0.25] -> c = r, log_coef = 0.375, grad on both tokens.
    # row 1 (A = -1): r = [-0.5, 0.25] -> c = r, log_coef = -0.125, grad on both tokens.
    logp = np.array([[0.5, 0.25], [-0.5, 0.25]])
    out = reference.gmpo_loss(logp, np.zeros((2, 2)), [1.0, -1.0], np.ones((2, 2)), epsilon=0.5)
    np.testing.assert_allclose(out.log_coef, [0.375, -0.125], rtol=0, atol=EXACT)
    # grad = (1/2) * -A * exp(log_coef) / 2 on every token.
    g0, g1 = -math.exp(0.375) / 4, math.exp(-0.125) / 4
    np.testing.assert_allclose(out.grad_logp, [[g0, g0], [g1, g1]], rtol=0, atol=EXACT)
    assert out.stats["num_clipped_low"] == 0
    assert out.stats["num_clipped_high"] == 0


def test_asymmetric_epsilon_high() -> None:
    # epsilon = 0.2 (lower), epsilon_high = 0.3 (upper).
    # row 0 (A = +1): r = [0.25, 0.5] -> c = [0.25, 0.3] (0.25 < 0.3 kept), log_coef = 0.275.
    # row 1 (A = -1): r = [-0.25, 0.5] -> c = [-0.2, 0.5] (no upper bound for A < 0), 0.15.
    logp = np.array([[0.25, 0.5], [-0.25, 0.5]])
    out = reference.gmpo_loss(
        logp, np.zeros((2, 2)), [1.0, -1.0], np.ones((2, 2)), epsilon=0.2, epsilon_high=0.3
    )
    np.testing.assert_allclose(out.log_coef, [0.275, 0.15], rtol=0, atol=EXACT)
    np.testing.assert_allclose(
        out.per_sequence_loss, [-math.exp(0.275), math.exp(0.15)], rtol=0, atol=EXACT
    )
    # high clip on row 0 token 1, low clip on row 1 token 0: gradient 0 there.
    g0, g1 = -math.exp(0.275) / 4, math.exp(0.15) / 4
    np.testing.assert_allclose(out.grad_logp, [[g0, 0], [0, g1]], rtol=0, atol=EXACT)
    assert (out.stats["num_clipped_low"], out.stats["num_clipped_high"]) == (1, 1)


def test_zero_advantage_row_is_exactly_zero_even_with_inf() -> None:
    # Row 0: A = 0 with ±inf and huge values at valid positions (r = +inf, -inf, 1e300, nan).
    # Row 1: A = 0 with a finite r = 0.9 > epsilon: it must count in no clip metric.
    # Row 2: A = +1, r = [0.1] -> loss_2 = -exp(0.1).
    logp = np.array([[INF, -INF, 1e300, INF], [-0.1, -0.1, 0, 0], [-0.9, 0, 0, 0]])
    old = np.array([[0.0, 0.0, 0.0, INF], [-1.0, -1.0, 0, 0], [-1.0, 0, 0, 0]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    with np.errstate(all="raise"):  # the reference must not even warn
        out = reference.gmpo_loss(logp, old, [0.0, 0.0, 1.0], mask)
    np.testing.assert_array_equal(out.per_sequence_loss[:2], [0.0, 0.0])
    assert out.per_sequence_loss[2] == pytest.approx(-math.exp(0.1), abs=EXACT)
    assert out.loss == pytest.approx(-math.exp(0.1) / 3, abs=EXACT)
    np.testing.assert_array_equal(out.grad_logp[:2], np.zeros((2, 4)))
    assert out.grad_logp[2, 0] == pytest.approx(-math.exp(0.1) / 3, abs=EXACT)  # (1/3)*-1*e^.1/1
    # A = 0 uses the upper bound (docs/semantics.md S1): row 1 c = [min(0.9, 0.4)] * 2, log_coef = 0.4.
    assert out.log_coef[1] == pytest.approx(0.4, abs=EXACT)
    assert out.stats["num_tokens"] == 7  # A = 0 rows count as tokens ...
    assert out.stats["num_clipped_high"] == 0  # ... but not as clipped
    np.testing.assert_array_equal(out.stats["row_clip_high"], [0, 0, 0])


def test_empty_row_contributes_zero_and_counts_in_mean() -> None:
    # Row 0: A = +3, no valid token (NaN everywhere). Row 1: A = +1, r = [0.2] -> -exp(0.2).
    logp = np.array([[NAN, NAN], [-0.8, NAN]])
    old = np.array([[NAN, NAN], [-1.0, NAN]])
    out = reference.gmpo_loss(logp, old, [3.0, 1.0], [[0, 0], [1, 0]])
    np.testing.assert_allclose(out.per_sequence_loss, [0.0, -math.exp(0.2)], rtol=0, atol=EXACT)
    assert out.log_coef[0] == 0.0
    assert out.loss == pytest.approx(-math.exp(0.2) / 2, abs=EXACT)  # mean over B = 2
    np.testing.assert_array_equal(out.grad_logp[0], [0.0, 0.0])
    assert out.grad_logp[1, 0] == pytest.approx(-math.exp(0.2) / 2, abs=EXACT)


def test_no_valid_token_at_all() -> None:
    out = reference.gmpo_loss(np.full((2, 3), NAN), None, [1.0, -1.0], np.zeros((2, 3)))
    assert out.loss == 0.0
    np.testing.assert_array_equal(out.grad_logp, np.zeros((2, 3)))
    assert out.stats["log_ratio_min"] == INF and out.stats["log_ratio_max"] == -INF
    assert out.metrics["clip_ratio/low_mean"] == 0.0
    for key in ("clip_ratio/low_min", "clip_ratio/high_max", "log_ratio/min", "log_ratio/max"):
        assert math.isnan(out.metrics[key]), key


def test_kl_hand_case() -> None:
    # One row, A = +1, on-policy (r = 0), beta = 0.1; padding holds NaN.
    # d = ref - logp = [-1.5 - (-1.0), -1.0 - (-2.0)] = [-0.5, 1.0]
    # k = expm1(d) - d = [expm1(-0.5) + 0.5, e - 2] = [0.1065306597126334, 0.7182818284590451]
    # KL = (k0 + k1) / 2; loss = -1 * exp(0) + 0.1 * KL.
    logp = np.array([[-1.0, -2.0, NAN]])
    ref = np.array([[-1.5, -1.0, NAN]])
    out = reference.gmpo_loss(logp, None, [1.0], [[1, 1, 0]], beta=0.1, ref_logp=ref)
    k0, k1 = math.expm1(-0.5) + 0.5, math.e - 2
    assert out.loss == pytest.approx(-1.0 + 0.1 * (k0 + k1) / 2, abs=EXACT)
    assert out.stats["kl_sum"] == pytest.approx(k0 + k1, abs=EXACT)
    assert out.metrics["kl"] == pytest.approx((k0 + k1) / 2, abs=EXACT)
    # grad = -1 * 1 / 2 + 0.1 / 2 * (1 - exp(d)), B = 1.
    expected = [-0.5 + 0.05 * (1 - math.exp(-0.5)), -0.5 + 0.05 * (1 - math.e), 0.0]
    np.testing.assert_allclose(out.grad_logp, [expected], rtol=0, atol=EXACT)


def test_kl_is_kept_in_zero_advantage_rows_and_unweighted() -> None:
    # A = 0: policy term 0, the row still carries beta * KL; a row weight scales only the policy.
    # d = [0.5]; k = expm1(0.5) - 0.5; per_sequence_loss = 0.2 * k; grad = 0.2 * (1 - e^0.5).
    out = reference.gmpo_loss(
        [[-1.0]], None, [0.0], [[1]], beta=0.2, ref_logp=[[-0.5]], is_weights=[7.0]
    )
    k = math.expm1(0.5) - 0.5
    assert out.per_sequence_loss[0] == pytest.approx(0.2 * k, abs=EXACT)
    assert out.grad_logp[0, 0] == pytest.approx(0.2 * (1 - math.exp(0.5)), abs=EXACT)


def test_row_weights_scale_the_policy_term() -> None:
    # Same two rows as the first hand case, with w = [0.5, 3]:
    # loss = (-0.5 * exp(0.25) + 3 * 2 * exp(-1/15)) / 2.
    case = _two_row_case()
    for w in ([0.5, 3.0], [[0.5], [3.0]]):
        out = reference.gmpo_loss(**case, is_weights=w)
        expected = (-0.5 * math.exp(0.25) + 6 * math.exp(-1 / 15)) / 2
        assert out.loss == pytest.approx(expected, abs=EXACT)
        assert out.grad_logp[0, 0] == pytest.approx(-0.5 * math.exp(0.25) / 4, abs=EXACT)
        assert out.grad_logp[1, 1] == pytest.approx(3 * math.exp(-1 / 15) / 3, abs=EXACT)


def test_token_weights_geometric_mean_and_zero_removes_token() -> None:
    # One row, A = +1, r = [0.1, 5.0, 0.3], token weights [2, 0, 8].
    # The zero weight removes token 1: n = 2, c = [0.1, 0.3], log_coef = 0.2,
    # w = exp((log 2 + log 8) / 2) = sqrt(16) = 4; loss = -4 * exp(0.2).
    logp = np.array([[-0.9, 4.0, -0.7]])
    old = np.array([[-1.0, -1.0, -1.0]])
    out = reference.gmpo_loss(logp, old, [1.0], [[1, 1, 1]], is_weights=[[2.0, 0.0, 8.0]])
    assert out.log_coef[0] == pytest.approx(0.2, abs=EXACT)
    assert out.loss == pytest.approx(-4 * math.exp(0.2), abs=EXACT)
    g = -4 * math.exp(0.2) / 2
    np.testing.assert_allclose(out.grad_logp, [[g, 0.0, g]], rtol=0, atol=EXACT)
    # The removed token (r = 5 > 0.4) is in no metric.
    assert out.stats["num_tokens"] == 2
    assert out.stats["num_clipped_high"] == 0
    assert out.stats["log_ratio_max"] == pytest.approx(0.3, abs=EXACT)
    # Same as masking the token out and passing the row weight 4.
    masked = reference.gmpo_loss(logp, old, [1.0], [[1, 0, 1]], is_weights=[4.0])
    assert out.loss == pytest.approx(masked.loss, abs=EXACT)


def test_dual_clip_hand_case() -> None:
    # dual_clip = e, so log c = 1; epsilon_high = 2 so the upper clip leaves row 1 alone.
    # Row 0 (A = -1): r = [1.5, 0.2] -> c = [min(1.5, 1), 0.2], log_coef = 0.6,
    #   loss_0 = exp(0.6); token 0 is dual-clipped (gradient 0).
    # Row 1 (A = +1): r = [0.2, 1.5]; the dual clip does not apply to A > 0: c = r,
    #   log_coef = 0.85, loss_1 = -exp(0.85), gradient on both tokens, no dual count.
    logp = np.array([[1.5, 0.2], [0.2, 1.5]])
    args = (logp, np.zeros((2, 2)), [-1.0, 1.0], np.ones((2, 2)))
    out = reference.gmpo_loss(*args, epsilon_high=2.0, dual_clip=math.e)
    np.testing.assert_allclose(out.log_coef, [0.6, 0.85], rtol=0, atol=EXACT)
    assert out.loss == pytest.approx((math.exp(0.6) - math.exp(0.85)) / 2, abs=EXACT)
    g1 = -math.exp(0.85) / 4
    np.testing.assert_allclose(
        out.grad_logp, [[0.0, math.exp(0.6) / 4], [g1, g1]], rtol=0, atol=EXACT
    )
    assert out.stats["num_clipped_dual"] == 1
    assert out.metrics["clip_ratio/dual_mean"] == pytest.approx(1 / 4, abs=EXACT)
    # Without the dual clip, row 0 keeps r = 1.5: log_coef = 0.85.
    plain = reference.gmpo_loss(*args, epsilon_high=2.0)
    assert plain.log_coef[0] == pytest.approx(0.85, abs=EXACT)
    assert "clip_ratio/dual_mean" not in plain.metrics


def test_row_clip_extremes_skip_empty_rows() -> None:
    # Row 0: empty (A = +1). Row 1 (A = -1): r = [-1.0, -0.6], both below -0.4 -> 2/2 = 1.
    # Row 2 (A = -1): r = [-1.0, 0.0] -> 1/2. Row 3 (A = +1): r = [0.5, 0.1] -> high 1/2.
    # 6 valid tokens: low_mean = 3/6, high_mean = 1/6, high_max = 1/2.
    logp = np.array([[NAN, NAN], [-1.0, -0.6], [-1.0, 0.0], [0.5, 0.1]])
    mask = np.array([[0, 0], [1, 1], [1, 1], [1, 1]])
    out = reference.gmpo_loss(logp, np.zeros((4, 2)), [1.0, -1.0, -1.0, 1.0], mask)
    np.testing.assert_allclose(out.stats["row_clip_low"], [0, 1, 0.5, 0], rtol=0, atol=EXACT)
    np.testing.assert_allclose(out.stats["row_clip_high"], [0, 0, 0, 0.5], rtol=0, atol=EXACT)
    assert out.metrics["clip_ratio/low_mean"] == pytest.approx(3 / 6, abs=EXACT)
    assert out.metrics["clip_ratio/high_mean"] == pytest.approx(1 / 6, abs=EXACT)
    assert out.metrics["clip_ratio/high_max"] == pytest.approx(0.5, abs=EXACT)
    # Rows 0-2 only: the empty row (row_clip_low 0) is skipped, so low_min = min(1, 1/2).
    first = reference.gmpo_loss(logp[:3], np.zeros((3, 2)), [1.0, -1.0, -1.0], mask[:3])
    assert first.metrics["clip_ratio/low_min"] == pytest.approx(0.5, abs=EXACT)


def test_invalid_positions_never_matter() -> None:
    rng = np.random.default_rng(0)
    shape = (3, 5)
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=bool)
    clean: dict[str, Any] = {
        "logp": rng.normal(-1.0, 0.5, shape),
        "old_logp": rng.normal(-1.0, 0.5, shape),
        "ref_logp": rng.normal(-1.0, 0.5, shape),
        "is_weights": rng.uniform(0.5, 2.0, shape),
    }
    dirty: dict[str, Any] = {
        k: np.where(mask, v, np.array([NAN, INF, -INF, 1e308, 0.0])) for k, v in clean.items()
    }
    kwargs: dict[str, Any] = {"beta": 0.05, "dual_clip": 2.0, "epsilon": 0.3}
    a = reference.gmpo_loss(**clean, advantages=[1.0, -2.0, 3.0], mask=mask, **kwargs)
    with np.errstate(all="raise"):
        b = reference.gmpo_loss(**dirty, advantages=[1.0, -2.0, 3.0], mask=mask, **kwargs)
    assert a.loss == b.loss and np.isfinite(b.loss)
    np.testing.assert_array_equal(a.per_sequence_loss, b.per_sequence_loss)
    np.testing.assert_array_equal(a.grad_logp, b.grad_logp)
    assert a.metrics == b.metrics
    for key, value in a.stats.items():
        np.testing.assert_array_equal(value, b.stats[key])


# --------------------------------------------------------------------------- finite differences


def _away_from_bounds(r: NDArray[np.float64], bounds: tuple[float, ...], gap: float) -> bool:
    return all(np.abs(r - b).min() > gap for b in bounds)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_extras", [False, True])
def test_gradient_matches_central_differences(seed: int, with_extras: bool) -> None:
    rng = np.random.default_rng(seed)
    batch, length = 5, 6
    lengths = np.array([6, 4, 1, 0, 5])
    mask = np.arange(length)[None, :] < lengths[:, None]  # (B, T); row 3 is empty
    adv = np.array([1.3, -0.7, 0.8, 2.0, 0.0]) * rng.choice([-1.0, 1.0])
    eps, eps_high, dual = 0.3, 0.5, 2.0
    bounds = (-eps, eps_high, math.log(dual))
    old = rng.normal(-1.5, 0.5, (batch, length))
    while True:  # draw log-ratios that straddle the bounds but sit at least 1e-3 away from them
        r = rng.uniform(-1.2, 1.2, (batch, length))
        if _away_from_bounds(r[mask], bounds, 1e-3):
            break
    logp = np.where(mask, old + r, NAN)
    kwargs: dict[str, Any] = {"epsilon": eps, "epsilon_high": eps_high}
    if with_extras:
        weights = rng.uniform(0.5, 2.0, (batch, length))
        weights[0, 2] = 0.0  # removes one token
        kwargs |= {
            "beta": 0.1,
            "ref_logp": old + rng.normal(0.0, 0.5, (batch, length)),
            "is_weights": weights,
            "dual_clip": dual,
        }
    out = reference.gmpo_loss(logp, old, adv, mask, **kwargs)
    h = 1e-6
    numeric = np.zeros_like(logp)
    for i, t in np.ndindex(batch, length):
        up, down = logp.copy(), logp.copy()
        up[i, t] += h
        down[i, t] -= h
        plus = reference.gmpo_loss(up, old, adv, mask, **kwargs).loss
        minus = reference.gmpo_loss(down, old, adv, mask, **kwargs).loss
        numeric[i, t] = (plus - minus) / (2 * h)
    np.testing.assert_allclose(out.grad_logp, numeric, rtol=1e-6, atol=1e-9)
    assert np.count_nonzero(out.grad_logp) > 0
    # The draw must exercise a clipped token with a zero gradient (so u_t is tested).
    assert out.stats["num_clipped_low"] + out.stats["num_clipped_high"] > 0


# --------------------------------------------------------------------------- validation


GOOD: dict[str, Any] = {
    "logp": np.zeros((2, 3)),
    "old_logp": np.zeros((2, 3)),
    "advantages": np.ones(2),
    "mask": np.ones((2, 3)),
}


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"beta": 0.1}, "ref_logp"),
        ({"beta": -0.1, "ref_logp": np.zeros((2, 3))}, "beta"),
        ({"old_logp": np.zeros((2, 4))}, "old_logp"),
        ({"mask": np.ones((3, 3))}, "mask"),
        ({"mask": np.ones((2, 3), dtype=complex)}, "mask"),
        ({"advantages": np.ones((2, 1))}, "advantages"),
        ({"logp": np.zeros(3), "old_logp": None, "mask": np.ones(3)}, "logp"),
        ({"ref_logp": np.zeros((2, 2))}, "ref_logp"),
        ({"is_weights": np.ones(3)}, "is_weights"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -0.2}, "epsilon"),
        ({"epsilon": NAN}, "epsilon"),
        ({"epsilon": INF}, "epsilon"),
        ({"epsilon_high": 0.0}, "epsilon_high"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"dual_clip": 0.5}, "dual_clip"),
    ],
)
def test_bad_input_raises(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        reference.gmpo_loss(**(GOOD | changes))
