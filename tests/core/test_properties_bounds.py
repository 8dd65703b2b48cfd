"""Property tests of gmpo_loss: exact zeros, the trust region's bounds and the KL term
(docs/semantics.md), against the independent float64 reference.

Every property runs on both paths (``impl`` fixture: "plain" and "compiled").
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gmpo_core import masked_geometric_mean, sequence_kl
from gmpo_core.metrics import metrics, minima, sums
from tests._helpers import (
    run,
    valid_log_ratio,
)
from tests.strategies import Batch, batches, garbage

# ---------------------------------------------------------------------------------------------
# Exact zeros, bounds, KL
# ---------------------------------------------------------------------------------------------


@given(batches())
def test_clipped_tokens_empty_rows_and_zero_advantage_rows_get_zero_gradient(
    impl: str, batch: Batch
) -> None:
    """Exact zeros: clipped tokens get no policy gradient, empty rows contribute nothing, A = 0
    rows contribute nothing to the policy term."""
    kw = {
        k: v for k, v in batch.kwargs.items() if k not in ("beta", "ref_logp")
    }  # policy term only
    batch = Batch(batch.logp, batch.old_logp, batch.advantages, batch.mask, kw)
    out, grad = run(batch, impl)
    r = torch.tensor(batch.logp) - torch.tensor(batch.old_logp)
    a = torch.tensor(batch.advantages)[:, None]
    eps_l, eps_h = kw["epsilon"], kw.get("epsilon_high") or kw["epsilon"]
    clipped = torch.where(a >= 0, r > eps_h, r < -eps_l)
    if kw.get("dual_clip") is not None:
        clipped |= (a < 0) & (r > float(np.log(kw["dual_clip"])))
    assert torch.equal(grad[clipped], torch.zeros(int(clipped.sum())))
    empty = torch.tensor(~batch.mask.any(1))
    zero_adv = torch.tensor(batch.advantages == 0)
    for rows in (empty, zero_adv):
        assert torch.equal(out.per_sequence_loss[rows], torch.zeros(int(rows.sum())))
        assert torch.equal(grad[rows], torch.zeros(int(rows.sum()), batch.shape[1]))
    assert torch.equal(grad[torch.tensor(~batch.mask)], torch.zeros(int((~batch.mask).sum())))


@given(batches(beta=False))
def test_log_coef_respects_the_trust_region(impl: str, batch: Batch) -> None:
    out, _ = run(batch, impl)
    lc = out.log_coef.detach()
    eps_l = batch.kwargs["epsilon"]
    eps_h = batch.kwargs.get("epsilon_high") or eps_l
    a = torch.tensor(batch.advantages)
    # A float32 mean of n values each <= x is <= x only up to its rounding error, about n ulps of
    # x (n rounded additions and a division; the order of the additions depends on the kernel
    # and the thread count): all n tokens at the bound is the worst case.
    n = max(1, int(batch.mask.sum(1).max()))
    ulp = lambda x: (n + 1) * torch.finfo(torch.float32).eps * abs(x)  # noqa: E731
    assert (lc[a > 0] <= eps_h + ulp(eps_h)).all()
    assert (lc[a < 0] >= -eps_l - ulp(eps_l)).all()
    if batch.kwargs.get("dual_clip") is not None:
        log_c = float(np.log(batch.kwargs["dual_clip"]))
        assert (lc[a < 0] <= log_c + ulp(log_c)).all()


@given(batches(weights=False, dual=False), st.sampled_from([0.04, 1.0]))
def test_kl_is_non_negative_and_zero_at_the_reference(impl: str, batch: Batch, beta: float) -> None:
    kw = {k: v for k, v in batch.kwargs.items() if k not in ("beta", "ref_logp")}
    zero_adv = Batch(batch.logp, batch.old_logp, np.zeros_like(batch.advantages), batch.mask, kw)
    # with A = 0 the per-sequence loss is beta * KL_i alone
    far = zero_adv.with_kwargs(beta=beta, ref_logp=batch.logp - 7.5 * np.sign(batch.logp + 5))
    out, _ = run(far, impl)
    assert (out.per_sequence_loss >= 0).all()
    assert out.metrics["kl"] >= 0
    same = zero_adv.with_kwargs(beta=beta, ref_logp=batch.logp.copy())
    out, grad = run(same, impl)
    assert torch.equal(out.per_sequence_loss, torch.zeros(batch.shape[0]))
    assert out.metrics["kl"] == 0
    assert torch.equal(grad, torch.zeros(batch.shape))


@given(
    arrays(
        np.float32, st.integers(1, 64), elements=st.floats(-20, 0, width=32, allow_subnormal=False)
    ),
    arrays(np.float32, 64, elements=st.floats(2**-20, 2**-9, width=32, allow_subnormal=False)),
    st.sampled_from([1.0, -1.0]),
)
def test_kl_is_non_negative_for_tiny_differences(
    logp: np.ndarray, delta: np.ndarray, sign: float
) -> None:
    """k3 = expm1(d) - d >= 0 per token even where d is tiny (exp(d) - 1 - d rounds below 0 in
    float32), and within a few ulps of d (absolute) of the exact value there."""
    lp = torch.tensor(logp)[:, None]
    ref = lp + sign * torch.tensor(delta[: len(logp)])[:, None]
    kl = sequence_kl(lp, ref, torch.ones_like(lp))  # one token a row
    d = (ref.double() - lp.double())[:, 0]  # the difference the float32 inputs really hold
    assert (kl >= 0).all()
    exact = torch.expm1(d) - d  # float64: d^2 / 2 + d^3 / 6 + ...
    assert ((kl.double() - exact).abs() <= 4e-7 * d.abs()).all()


@given(st.integers(1, 5), st.integers(1, 9), garbage(), st.data())
def test_building_blocks_ignore_masked_positions(
    b: int, t: int, junk: float, data: st.DataObject
) -> None:
    x = data.draw(
        arrays(np.float32, (b, t), elements=st.floats(-5, 5, width=32, allow_subnormal=False))
    )
    mask = data.draw(arrays(np.bool_, (b, t)))
    dirty = np.where(mask, x, np.float32(junk)).astype(np.float32)
    clean = np.where(mask, x, np.float32(0)).astype(np.float32)
    m = torch.tensor(mask)
    for fn in (
        lambda v: masked_geometric_mean(torch.tensor(v), m),
        lambda v: sequence_kl(torch.tensor(v), torch.tensor(v) * 0.5, m),
    ):
        assert torch.equal(fn(dirty), fn(clean))


@given(batches(weights=False, min_size=2))  # with T = 1 a (B, 1) weight is a row weight
def test_zero_weight_tokens_are_removed_as_if_never_generated(impl: str, batch: Batch) -> None:
    """A (B, T) rollout weight of 0 removes the token from the row (docs/semantics.md S7): the same as
    masking it out, with the remaining weights equal to 1."""
    b, t = batch.shape
    drop = np.zeros((b, t), bool)
    drop[:, ::3] = True
    weights = np.where(drop, 0.0, 1.0).astype(np.float32)
    out_w, grad_w = run(batch.with_kwargs(is_weights=weights), impl)
    masked = Batch(batch.logp, batch.old_logp, batch.advantages, batch.mask & ~drop, batch.kwargs)
    out_m, grad_m = run(masked, impl)
    # equal up to the order of float32 sums (the two calls may run different kernels)
    torch.testing.assert_close(
        out_w.per_sequence_loss, out_m.per_sequence_loss, rtol=1e-6, atol=1e-7
    )
    torch.testing.assert_close(grad_w, grad_m, rtol=1e-6, atol=1e-9)
    assert out_w.metrics.keys() == out_m.metrics.keys()
    for k in out_w.metrics:
        torch.testing.assert_close(
            out_w.metrics[k], out_m.metrics[k], rtol=1e-6, atol=1e-7, equal_nan=True, msg=k
        )


def test_valid_log_ratio_helper_excludes_masked() -> None:
    b = Batch(np.zeros((1, 2), np.float32), np.array([[1.0, 2.0]], np.float32), np.ones(1, np.float32),
              np.array([[True, False]]), {"epsilon": 0.4})  # fmt: skip
    assert valid_log_ratio(b).tolist() == [-1.0]


@given(batches(min_size=0))
def test_output_metrics_are_the_stats_metrics_to_the_bit(impl: str, batch: Batch) -> None:
    """``GMPOOutput.metrics`` reads the call's two statistics tensors directly; ``stats.metrics``
    and the adapters' reductions (``sums``, ``minima``, then ``metrics``) go through the
    ``ClipStats`` record: the same values, to the bit, with and without KL and dual clip, empty
    batches and rows included."""
    out, _ = run(batch, impl)
    dual = "dual_clip" in batch.kwargs
    via_record = out.stats.metrics(out.kl_sum)
    reduced = metrics(sums(out.stats, out.kl_sum), minima(out.stats), dual, out.kl_sum is not None)
    for other in (via_record, reduced):
        assert out.metrics.keys() == other.keys()
        for key, value in out.metrics.items():
            torch.testing.assert_close(value, other[key], rtol=0, atol=0, equal_nan=True)
