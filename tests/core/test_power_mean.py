"""``masked_power_mean``: the power mean of ratios in log space (docs/semantics.md S17), against
the float64 reference (``reference.masked_power_mean``) and its defining properties."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gmpo_core import _power, masked_geometric_mean, masked_power_mean, reference
from tests.strategies import POWERS, garbage, log_value_rows, powers

EPS = {torch.float32: 2.0**-23, torch.float64: 2.0**-52}
FLOATS = [torch.float32, torch.float64]
# the reference's own error (its series and logsumexp meet at |p| max|x - mean| = 1e-3) is
# under 1e-13 max|x| in float64; float32 results are within 8 ulps of max|x|
VALUE_TOL = {torch.float32: 8 * EPS[torch.float32], torch.float64: 1e-12}
GRAD_TOL = {torch.float32: 8 * EPS[torch.float32], torch.float64: 1e-13}


def run(
    x: np.ndarray, mask: np.ndarray, p: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The value (B,) and the gradient of its sum (B, T) of a call on ``x`` as ``dtype``."""
    xt = torch.tensor(x).to(dtype).requires_grad_()
    out = masked_power_mean(xt, torch.tensor(mask), p)
    (grad,) = torch.autograd.grad(out.sum(), xt)
    return out.detach(), grad


def held(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The values ``dtype`` really holds, in float64."""
    return torch.tensor(x).to(dtype).double().numpy()


def scale(x: np.ndarray, mask: np.ndarray) -> float:
    return float(max(1.0, np.abs(np.where(mask, x, 0.0)).max(initial=0.0)))


def row_stats(x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's variance and max |x - mean| over valid positions (0 for an empty row), in
    float64. Shape: (B, T) -> (B,), (B,)."""
    n = np.maximum(mask.sum(1), 1)
    mean = np.where(mask, x, 0).sum(1) / n
    d = np.where(mask, x - mean[:, None], 0.0)
    return (d * d).sum(1) / n, np.abs(d).max(1, initial=0.0)


# the acceptance test: the seven exponents, values and gradients, empty rows included


@pytest.mark.parametrize("dtype", FLOATS)
@given(rows=log_value_rows())
def test_matches_the_float64_reference(
    dtype: torch.dtype, rows: tuple[np.ndarray, np.ndarray]
) -> None:
    x, mask = rows
    empty = ~mask.any(1)
    for p in POWERS:
        value, grad = run(x, mask, p, dtype)
        assert value.dtype == dtype and grad.dtype == dtype
        exp = reference.masked_power_mean(held(x, dtype), mask, p)
        tol = VALUE_TOL[dtype] * scale(x, mask)
        np.testing.assert_allclose(value.numpy(), exp.value, rtol=0, atol=tol, err_msg=f"{p}")
        np.testing.assert_allclose(grad.numpy(), exp.grad, rtol=0, atol=GRAD_TOL[dtype])
        assert (value.numpy()[empty] == 0).all() and (exp.value[empty] == 0).all()
        assert (grad.numpy()[~mask] == 0).all()


@pytest.mark.parametrize("p", POWERS)
@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (2, 5)])
def test_empty_rows_give_zero(p: float, shape: tuple[int, int]) -> None:
    """No valid token, no column, no row: 0 (M = 1) and a zero gradient, as
    ``masked_geometric_mean`` gives."""
    x = torch.full(shape, 7.0, requires_grad=True)
    mask = torch.zeros(shape, dtype=torch.bool)
    out = masked_power_mean(x, mask, p)
    assert torch.equal(out, torch.zeros(shape[0]))
    assert torch.equal(out, masked_geometric_mean(x, mask))
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.equal(grad, torch.zeros(shape))
    exp = reference.masked_power_mean(np.full(shape, 7.0), np.zeros(shape), p)
    assert (exp.value == 0).all() and (exp.grad == 0).all()


# the properties


@pytest.mark.parametrize("dtype", [*FLOATS, torch.bfloat16, torch.float16])
@given(rows=log_value_rows())
def test_p_0_is_the_geometric_mean(dtype: torch.dtype, rows: tuple[np.ndarray, np.ndarray]) -> None:
    """Bit for bit the geometric mean computed in the compute dtype (float32 for bf16/fp16),
    for every spelling of 0."""
    x, mask = rows
    xt, m = torch.tensor(x).to(dtype), torch.tensor(mask)
    expected = masked_geometric_mean(
        xt.to(torch.float64 if dtype == torch.float64 else torch.float32), m
    )
    for zero in (0.0, -0.0, 0, np.float32(0), Fraction(0)):
        assert torch.equal(masked_power_mean(xt, m, zero), expected), repr(zero)


@pytest.mark.parametrize("dtype", FLOATS)
@given(rows=log_value_rows(), ps=st.lists(powers, min_size=2, max_size=5))
def test_non_decreasing_in_p_and_between_min_and_max(
    dtype: torch.dtype, rows: tuple[np.ndarray, np.ndarray], ps: list[float]
) -> None:
    x, mask = rows
    ps = sorted({*ps, 1e-6, -1e-6, 0.0})
    values = np.stack([run(x, mask, p, dtype)[0].numpy() for p in ps])  # (P, B)
    slack = 16 * EPS[dtype] * scale(x, mask)  # each value within 8 ulps of the exact one
    assert (np.diff(values, axis=0) >= -slack).all()
    xs = held(x, dtype)
    lo = np.where(mask, xs, np.inf).min(1, initial=np.inf)
    hi = np.where(mask, xs, -np.inf).max(1, initial=-np.inf)
    nonempty = mask.any(1)
    assert (values[:, nonempty] >= lo[nonempty] - slack).all()
    assert (values[:, nonempty] <= hi[nonempty] + slack).all()


@pytest.mark.parametrize("dtype", FLOATS)
@given(rows=log_value_rows())
def test_p_1_is_the_log_of_the_arithmetic_mean(
    dtype: torch.dtype, rows: tuple[np.ndarray, np.ndarray]
) -> None:
    """log(mean exp(x)), written as it stands in float64 (no overflow for |x| <= 80)."""
    x, mask = rows
    xs = held(x, dtype)
    n = mask.sum(1)
    ratios = np.where(mask, np.exp(np.where(mask, xs, 0.0)), 0.0).sum(1) / np.maximum(n, 1)
    expected = np.where(n > 0, np.log(np.where(n > 0, ratios, 1.0)), 0.0)
    value, _ = run(x, mask, 1.0, dtype)
    np.testing.assert_allclose(
        value.numpy(), expected, rtol=0, atol=VALUE_TOL[dtype] * scale(x, mask)
    )


# near 0, deep in the expansion (1 / p is past float32's range; 5e-324 is 0 in float32), far
SPECIAL = [*POWERS, 1e-6, -1e-6, 1e-21, -1e-300, 5e-324, 50.0, -50.0, 1e18, -1e18]


@pytest.mark.parametrize("dtype", [*FLOATS, torch.bfloat16, torch.float16])
@given(rows=log_value_rows(bound=80.0), p=st.sampled_from(SPECIAL))
def test_gradients_are_finite_up_to_80(
    p: float, dtype: torch.dtype, rows: tuple[np.ndarray, np.ndarray]
) -> None:
    """|x| up to 80 (exp(2 * 80) is past float32's range): finite values and gradients, the
    gradient a distribution over each row's valid tokens (non-negative, summing to 1), in the
    input's dtype; the value in the compute dtype."""
    x, mask = rows
    xt = torch.tensor(x).to(dtype).requires_grad_()
    out = masked_power_mean(xt, torch.tensor(mask), p)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    (grad,) = torch.autograd.grad(out.sum(), xt)
    assert grad.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(grad).all() and (grad >= 0).all()
    sums = grad.double().sum(1).numpy()
    t = x.shape[1]
    tol = 4 * t * (EPS[dtype] if dtype in EPS else 2.0**-8)  # each weight rounded once
    np.testing.assert_allclose(sums, mask.any(1).astype(float), rtol=0, atol=tol)


NEAR_0 = [1e-6, -1e-6, 1e-12, -1e-12, 1e-19, -1e-19, 1e-300, -5e-324] + [
    sign * _power.SERIES_BELOW * f for sign in (1, -1) for f in (1 - 2**-20, 1)
]  # the last four: both sides of the switch to the expansion


@pytest.mark.parametrize("dtype", FLOATS)
@given(rows=log_value_rows())
def test_continuous_at_p_0(dtype: torch.dtype, rows: tuple[np.ndarray, np.ndarray]) -> None:
    """M_p = M_0 + p var(x) / 2 + O(p^2) (the slope at 0 is half the variance; the next term is
    p^2 k3 / 6, |k3| <= max|x - mean|^3), within a few ulps: no digit is lost to the division
    by p (written as it stands, float32 is 0.25 to 0.5 off at p = 1e-6 on rows of 8 to 1024
    tokens), on both sides of the
    switch to the expansion at |p| = 1e-20. The gradient is 1/n + O(p)."""
    x, mask = rows
    at_0, grad_0 = run(x, mask, 0.0, dtype)
    var, spread = row_stats(held(x, dtype), mask)
    n = np.maximum(mask.sum(1, keepdims=True), 1)
    for p in NEAR_0:
        value, grad = run(x, mask, p, dtype)
        tol = 16 * EPS[dtype] * scale(x, mask) + p**2 * spread**3 / 6
        assert (np.abs(value.numpy() - (at_0.numpy() + p * var / 2)) <= tol).all(), p
        gtol = 2 * abs(p) * spread[:, None] / n + GRAD_TOL[dtype]
        assert (np.abs(grad.numpy() - grad_0.numpy()) <= gtol).all(), p


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("t", [4096, 65536])
def test_long_rows_where_one_token_dominates(t: int, dtype: torch.dtype) -> None:
    """One token far above (p > 0) or below (p < 0) the others: the mean of exp(p (x - m)) is
    near 1/n, where log1p would amplify the rounding of its argument n-fold (log1p alone is
    4e-4 off at n = 4096 and 1e-3 at 65536 in float32); the logsumexp takes over there."""
    g = torch.Generator().manual_seed(t)
    x = torch.rand(2, t, generator=g, dtype=torch.float64) * 10 - 15  # [-15, -5]
    x[1] = -x[1]
    x[0, t // 3], x[1, t // 2] = 10.0, -10.0
    x = x.to(dtype)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[:, -5:] = False
    for p in (2.0, 0.5, -0.5, -2.0):
        value, grad = run(x.numpy(), mask.numpy(), p, dtype)
        exp = reference.masked_power_mean(x.double().numpy(), mask.numpy(), p)
        tol = VALUE_TOL[dtype] * 15
        np.testing.assert_allclose(value.numpy(), exp.value, rtol=0, atol=tol, err_msg=f"{p}")
        np.testing.assert_allclose(grad.numpy(), exp.grad, rtol=0, atol=GRAD_TOL[dtype])


@given(rows=log_value_rows(), junk=garbage(), p=st.sampled_from(SPECIAL))
def test_masked_values_never_matter(
    p: float, rows: tuple[np.ndarray, np.ndarray], junk: float
) -> None:
    """NaN, inf and huge values at masked positions change no bit of the value or the gradient,
    and get a gradient of exactly 0 (S6)."""
    x, mask = rows
    dirty = np.where(mask, x, np.float32(junk)).astype(np.float32)
    value, grad = run(x, mask, p)
    dirty_value, dirty_grad = run(dirty, mask, p)
    assert torch.equal(value, dirty_value) and torch.equal(grad, dirty_grad)
    assert (dirty_grad[torch.tensor(~mask)] == 0).all()


@pytest.mark.parametrize("p", [-2.0, -0.5, 1e-6, 1.0, 2.0, 1e-21])
def test_gradient_matches_finite_differences(p: float) -> None:
    """torch's autograd (first and second order) against finite differences, in float64: an
    empty row, a hole, a tie at the row's extreme, NaN at a masked position."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) > 0.25
    mask[1] = False
    x[2, 4] = x[2, 5] = x[2].max() + 1
    mask[2, 4:] = True
    x[0, 0], mask[0, 0] = math.nan, False
    x.requires_grad_()

    def fn(v: torch.Tensor) -> torch.Tensor:
        return masked_power_mean(v, mask, p)

    x_clean = torch.where(mask, x.detach(), 0).requires_grad_()
    assert torch.autograd.gradcheck(fn, (x_clean,))
    assert torch.autograd.gradgradcheck(fn, (x_clean,))
    (grad,) = torch.autograd.grad(fn(x).sum(), x)
    exp = reference.masked_power_mean(x.detach().numpy(), mask.numpy(), p)
    np.testing.assert_allclose(grad.numpy(), exp.grad, rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "p",
    [math.nan, math.inf, -math.inf, 1.0000001e18, -2e18, 10**400, np.longdouble("1e400"),
     torch.tensor(0.5), "1", None, True, 1j],
)  # fmt: skip
def test_bad_p_is_a_value_error(p: Any) -> None:
    """A tensor p is refused too: p is a constant of the formula (docs/semantics.md S17)."""
    with pytest.raises(ValueError, match=r"p must be a finite number with \|p\| <= 1e\+18"):
        masked_power_mean(torch.zeros(2, 3), torch.ones(2, 3), p)


@pytest.mark.parametrize("p", [math.nan, math.inf, -math.inf])
def test_the_reference_refuses_a_non_finite_p(p: float) -> None:
    with pytest.raises(ValueError, match="p must be finite"):
        reference.masked_power_mean(np.zeros((2, 3)), np.ones((2, 3)), p)


def test_other_arguments_are_checked() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"log_values must be a real floating"):
        masked_power_mean(x.long(), torch.ones(2, 3), 1.0)
    with pytest.raises(ValueError, match=r"mask must have the shape of log_values \(2, 3\)"):
        masked_power_mean(x, torch.ones(2, 2), 1.0)
    with pytest.raises(ValueError, match="mask is on device meta"):
        masked_power_mean(x, torch.ones(2, 3, device="meta"), 1.0)
    with pytest.raises(ValueError, match=r"log_values must have shape \(N,\)"):
        masked_power_mean(x, torch.ones(2, 3), 1.0, cu_seqlens=torch.tensor([0, 3]))
