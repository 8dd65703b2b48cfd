"""Property tests of gmpo_loss against the independent float64 reference (docs/semantics.md).

Every property runs on both paths (``impl`` fixture: "plain" and "compiled").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st

from gmpo_core import gmpo_loss, reference
from tests import _helpers
from tests._helpers import (
    assert_close,
    ref,
    rounded,
    run,
    to_torch,
    well_conditioned,
)
from tests.core._properties import assert_metrics_match, loss_scale
from tests.strategies import Batch, batches, garbage

# ---------------------------------------------------------------------------------------------
# Values, gradients and metrics equal the reference
# ---------------------------------------------------------------------------------------------


@given(batches())
@example(  # an empty row, an A = 0 row, and tokens far outside the clip range on both sides
    Batch(
        logp=np.array([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [-0.5, -0.5, -9.0]], np.float32),
        old_logp=np.array([[-1.5, -1.0, -3.0], [-4.0, -1.0, -1.0], [-0.5, -3.5, -2.0]], np.float32),
        advantages=np.array([1.0, 0.0, -1.0], np.float32),
        mask=np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], bool),
        kwargs={"epsilon": 0.4},
    )
)
def test_matches_reference_float32(impl: str, batch: Batch) -> None:
    assume(well_conditioned(batch))
    out, grad = run(batch, impl)
    exp = ref(batch)
    scale = loss_scale(exp.per_sequence_loss)
    assert out.loss.dtype == torch.float32 and out.loss.shape == ()
    assert_close(out.per_sequence_loss, exp.per_sequence_loss, torch.float32, "value", scale)
    assert_close(out.loss, exp.loss, torch.float32, "value", scale)
    assert_close(out.log_coef, exp.log_coef, torch.float32, "value", 10.0)
    assert_close(grad, exp.grad_logp, torch.float32, "grad", scale)
    assert_metrics_match(out, exp, batch)


@given(batches(), st.sampled_from([torch.bfloat16, torch.float16]))
def test_low_precision_inputs_match_reference(impl: str, batch: Batch, dtype: torch.dtype) -> None:
    """bf16/fp16 inputs are computed in float32: compare with the reference on the rounded inputs;
    the gradient comes back in the input dtype."""
    exact = rounded(batch, dtype)
    assume(well_conditioned(exact))
    out, grad = run(batch, impl, dtype)
    exp = ref(exact)
    assert out.loss.dtype == torch.float32
    assert grad.dtype == dtype
    scale = loss_scale(exp.per_sequence_loss)
    assume(np.all(np.abs(exp.grad_logp) < 6e4))  # fp16's range
    assert_close(out.per_sequence_loss, exp.per_sequence_loss, dtype, "value", scale)
    assert_close(grad, exp.grad_logp, dtype, "grad", scale)


@given(batches(), st.data())
def test_backward_with_random_upstream_gradient(
    impl: str, batch: Batch, data: st.DataObject
) -> None:
    """d/dlogp of sum_i g_i * per_sequence_loss_i, for a random g, equals B * g_i * reference
    gradient of row i (each row's loss depends on its own tokens only)."""
    assume(well_conditioned(batch))
    b = batch.shape[0]
    g = np.array(
        data.draw(
            st.lists(st.floats(-2, 2, width=32, allow_subnormal=False), min_size=b, max_size=b)
        ),
        np.float32,
    )
    args = to_torch(batch)
    out = gmpo_loss(**args, impl=impl)
    (grad,) = torch.autograd.grad((out.per_sequence_loss * torch.tensor(g)).sum(), args["logp"])
    exp = ref(batch)
    assert_close(
        grad,
        b * g[:, None] * exp.grad_logp,
        torch.float32,
        "grad",
        loss_scale(exp.per_sequence_loss) * b,
    )


# ---------------------------------------------------------------------------------------------
# Invariances
# ---------------------------------------------------------------------------------------------


@given(batches(), st.integers(1, 5), garbage(), st.data())
def test_padding_invariance(
    impl: str, batch: Batch, pad: int, junk: float, data: st.DataObject
) -> None:
    """Appending masked columns that hold NaN/inf/huge values changes nothing, and their
    gradient is exactly 0."""
    b, t = batch.shape

    def padded(a: np.ndarray, fill: float | bool) -> np.ndarray:
        return np.concatenate([a, np.full((b, pad), fill, a.dtype)], axis=1)

    kw = dict(batch.kwargs)
    if "ref_logp" in kw:
        kw["ref_logp"] = padded(kw["ref_logp"], junk)
    w = kw.get("is_weights")
    if w is not None and w.ndim == 2 and w.shape[1] > 1:
        kw["is_weights"] = padded(w, data.draw(st.sampled_from([junk, 1.0, 0.0])))
    big = Batch(padded(batch.logp, junk), padded(batch.old_logp, -junk), batch.advantages,
                padded(batch.mask, False), kw)  # fmt: skip
    out, grad = run(batch, impl)
    out_big, grad_big = run(big, impl)
    scale = float(max(1.0, out.per_sequence_loss.abs().max().item()))
    assert_close(
        out_big.per_sequence_loss, out.per_sequence_loss.detach(), torch.float32, "value", scale
    )
    assert_close(out_big.log_coef, out.log_coef.detach(), torch.float32, "value")
    assert_close(grad_big[:, :t], grad, torch.float32, "grad", scale)
    assert torch.equal(grad_big[:, t:], torch.zeros(b, pad))
    for k, v in out.metrics.items():
        torch.testing.assert_close(out_big.metrics[k], v, equal_nan=True, msg=k)


@given(batches(beta=False), garbage())
def test_zero_advantage_rows_are_exactly_zero(impl: str, batch: Batch, junk: float) -> None:
    """A = 0 rows: policy term and gradient exactly 0 whatever their log-ratios are: huge,
    infinite or NaN (docs/semantics.md S5)."""
    t = batch.shape[1]
    zero = batch.advantages == 0
    assume(zero.any())
    logp = batch.logp.copy()
    # at valid positions of A = 0 rows: huge, infinite, even NaN log-ratios
    logp[zero[:, None] & batch.mask] = junk
    logp[~batch.mask & zero[:, None]] = np.nan
    out, grad = run(Batch(logp, batch.old_logp, batch.advantages, batch.mask, batch.kwargs), impl)
    assert torch.equal(out.per_sequence_loss[torch.tensor(zero)], torch.zeros(int(zero.sum())))
    assert torch.equal(grad[torch.tensor(zero)], torch.zeros(int(zero.sum()), t))
    assert torch.isfinite(grad).all()
    assert torch.isfinite(out.loss)


@given(batches(), st.randoms(use_true_random=False))
def test_row_permutation_equivariance(impl: str, batch: Batch, rnd) -> None:  # type: ignore[no-untyped-def]
    b = batch.shape[0]
    perm = list(range(b))
    rnd.shuffle(perm)
    p = np.array(perm)
    kw = {k: v[p] if isinstance(v, np.ndarray) else v for k, v in batch.kwargs.items()}
    permuted = Batch(batch.logp[p], batch.old_logp[p], batch.advantages[p], batch.mask[p], kw)
    out, grad = run(batch, impl)
    out_p, grad_p = run(permuted, impl)
    scale = float(max(1.0, out.per_sequence_loss.abs().max().item()))
    assert_close(out_p.per_sequence_loss, out.per_sequence_loss[p], torch.float32, "value", scale)
    assert_close(out_p.loss, out.loss, torch.float32, "value", scale)
    assert_close(grad_p, grad[p], torch.float32, "grad", scale)


@given(batches(), st.integers(2, 3))
def test_duplicating_the_batch_leaves_the_loss_unchanged(impl: str, batch: Batch, k: int) -> None:
    rep = lambda a: np.concatenate([a] * k, axis=0)  # noqa: E731
    kw = {key: rep(v) if isinstance(v, np.ndarray) else v for key, v in batch.kwargs.items()}
    big = Batch(rep(batch.logp), rep(batch.old_logp), rep(batch.advantages), rep(batch.mask), kw)
    out, grad = run(batch, impl)
    out_big, grad_big = run(big, impl)
    scale = float(max(1.0, out.per_sequence_loss.abs().max().item()))
    assert_close(out_big.loss, out.loss, torch.float32, "value", scale)
    # each copy of a token carries 1/k of the gradient
    assert_close(grad_big * k, torch.cat([grad] * k), torch.float32, "grad", scale)


# ---------------------------------------------------------------------------------------------
# On-policy: GMPO == GRPO (per-sequence token mean)
# ---------------------------------------------------------------------------------------------


@given(batches(beta=False, weights=False))
def test_on_policy_loss_and_grpo_gradient(impl: str, batch: Batch) -> None:
    args = to_torch(batch)
    logp = args["logp"]
    out = gmpo_loss(logp, logp.detach(), args["advantages"], args["mask"], impl=impl,
                    **{k: v for k, v in batch.kwargs.items()})  # fmt: skip
    (grad,) = torch.autograd.grad(out.loss, logp)
    adv = args["advantages"].double()
    nonempty = args["mask"].any(1)
    expected = -(adv * nonempty).sum() / len(adv)
    assert_close(out.loss, expected.item(), torch.float32, "value", float(adv.abs().sum()) + 1)
    # GRPO, TRL loss_type="grpo": per token -A * ratio, token mean per row, mean over rows
    mask = args["mask"].float()
    ratio = torch.exp(logp - logp.detach())
    grpo = (-(args["advantages"][:, None] * ratio * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    (grpo_grad,) = torch.autograd.grad(grpo, logp)
    assert_close(grad, grpo_grad, torch.float32, "grad")


# Regression, defect 3 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): create_graph=True returned a gradient without a graph on the default path:
# second-order gradients are exact on every path.
@pytest.mark.parametrize("kl", [False, True])
def test_second_order_gradient_is_exact(impl: str, kl: bool) -> None:
    """gradgradcheck compares the Hessian-vector products with finite differences (float64,
    log-ratios away from the clip bounds, where the loss is smooth)."""
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    old = logp + 0.25 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    r = logp - old
    assert ((r - 0.4).abs() > 1e-3).all() and ((r + 0.4).abs() > 1e-3).all()
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    kw: dict[str, Any] = {"beta": 0.3, "ref_logp": old - 0.2} if kl else {}

    def loss(lp: torch.Tensor) -> torch.Tensor:
        return gmpo_loss(lp, old, adv, mask, impl=impl, **kw).loss

    assert torch.autograd.gradgradcheck(loss, (logp.requires_grad_(),))


def test_gradient_penalty_has_the_plain_graph(impl: str) -> None:
    """A gradient penalty ||d loss / d logp||^2 differentiated again: equal on every path."""
    x = _helpers.random_inputs(seed=4, dtype=torch.float64)
    grads = []
    for path in ("plain", impl):
        logp = x["logp"].detach().clone().requires_grad_()
        out = gmpo_loss(logp, x["old_logp"], x["advantages"], x["mask"], impl=path)
        (g,) = torch.autograd.grad(out.loss, logp, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), logp)
        grads.append(gg)
    assert grads[0].norm() > 0
    torch.testing.assert_close(grads[1], grads[0])


# Regression, defect 12 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): long rows are summed as accurately as torch sums them (0.1's one-pass kernel
# accumulated sequentially).
def test_long_rows_match_the_reference(impl: str) -> None:
    """At T = 131,072 the default path sums rows with ATen's pairwise sum (measured error
    <= 1e-9 on log_coef, about 0.3); compiled code accumulates sequentially per vector lane
    (<= 1e-7 measured; 0.1's default one-pass kernel gave the same, 100x torch's)."""
    t = 131072
    g = torch.Generator().manual_seed(12)
    logp = -torch.rand(2, t, generator=g)
    old = logp + 0.3 * torch.randn(2, t, generator=g)
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, t, dtype=torch.bool)
    out = gmpo_loss(logp, old, adv, mask, impl=impl)
    exp = reference.gmpo_loss(
        logp.double().numpy(), old.double().numpy(), adv.numpy(), mask.numpy()
    )
    atol = 5e-9 if impl == "plain" else 5e-7
    np.testing.assert_allclose(out.log_coef.detach().numpy(), exp.log_coef, rtol=0, atol=atol)
