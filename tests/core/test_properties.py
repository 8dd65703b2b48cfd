"""Property tests of gmpo_loss against the independent float64 reference (docs/semantics.md).

Every property runs on both paths (``impl`` fixture: "plain" and "compiled").
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gmpo_core import gmpo_loss, masked_geometric_mean, reference, sequence_kl
from tests import _helpers
from tests._helpers import (
    assert_close,
    ref,
    rounded,
    run,
    to_torch,
    valid_log_ratio,
    well_conditioned,
)
from tests._packed import packed_to_torch, ref_packed, run_packed, split_tokens
from tests.strategies import Batch, PackedBatch, batches, garbage, pack, packed_batches

METRIC_KEYS = {
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
    "clip_ratio/high_max", "log_ratio/min", "log_ratio/max",
}  # fmt: skip


def _scale(expected_per_seq: np.ndarray) -> float:
    return float(max(1.0, np.abs(expected_per_seq).max(initial=0.0)))


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
    scale = _scale(exp.per_sequence_loss)
    assert out.loss.dtype == torch.float32 and out.loss.shape == ()
    assert_close(out.per_sequence_loss, exp.per_sequence_loss, torch.float32, "value", scale)
    assert_close(out.loss, exp.loss, torch.float32, "value", scale)
    assert_close(out.log_coef, exp.log_coef, torch.float32, "value", 10.0)
    assert_close(grad, exp.grad_logp, torch.float32, "grad", scale)
    _assert_metrics_match(out, exp, batch)


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
    scale = _scale(exp.per_sequence_loss)
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
        _scale(exp.per_sequence_loss) * b,
    )


def _assert_metrics_match(out, exp, batch: Batch) -> None:  # type: ignore[no-untyped-def]
    m = {k: v.item() for k, v in out.metrics.items()}
    expected_keys = set(METRIC_KEYS)
    if batch.kwargs.get("beta"):
        expected_keys.add("kl")
    if batch.kwargs.get("dual_clip") is not None:
        expected_keys.add("clip_ratio/dual_mean")
    assert set(m) == expected_keys == set(exp.metrics)
    for key in expected_keys:
        tol = 1e-4 if key == "kl" else 1e-6  # kl sums exp() of up to 2 over the batch
        np.testing.assert_allclose(m[key], exp.metrics[key], rtol=tol, atol=1e-7, err_msg=key)
    s = out.stats
    assert s.num_tokens.item() == exp.stats["num_tokens"]
    assert s.num_clipped_low.item() == exp.stats["num_clipped_low"]
    assert s.num_clipped_high.item() == exp.stats["num_clipped_high"]
    if batch.kwargs.get("dual_clip") is not None:
        assert s.num_clipped_dual is not None
        assert s.num_clipped_dual.item() == exp.stats["num_clipped_dual"]
    else:
        assert s.num_clipped_dual is None
    # the per-row extremes, over the rows that have a valid token (+-inf when none has)
    nonempty = exp.stats["row_clip_low"][valid_rows(batch)]
    low_min = nonempty.min(initial=np.inf)
    high_max = exp.stats["row_clip_high"][valid_rows(batch)].max(initial=-np.inf)
    np.testing.assert_allclose(s.row_clip_low_min.item(), low_min, rtol=1e-6)
    np.testing.assert_allclose(s.row_clip_high_max.item(), high_max, rtol=1e-6)


def valid_rows(batch: Batch) -> np.ndarray:
    """Rows with at least one valid token (zero-weight tokens excluded). Shape: (B,) bool."""
    valid = batch.mask.copy()
    w = batch.kwargs.get("is_weights")
    if w is not None and w.ndim == 2 and w.shape[1] > 1:
        valid &= w != 0
    return valid.any(-1)


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


# ---------------------------------------------------------------------------------------------
# Packed sequences (cu_seqlens): the padded call's result on the same rows
# ---------------------------------------------------------------------------------------------


@given(packed_batches())
@example(  # empty segments first, in the middle and last; a hole; a row weight
    pack(
        Batch(
            logp=np.array([[-1.0, -2.0], [-0.5, -1.0], [-2.0, -0.1], [-1.0, -1.0]], np.float32),
            old_logp=np.array([[-1.5, -1.0], [-0.5, -3.5], [-1.0, -1.0], [-1.0, -1.0]], np.float32),
            advantages=np.array([1.0, -1.0, 0.5, -2.0], np.float32),
            mask=np.array([[1, 1], [1, 0], [1, 1], [1, 1]], bool),
            kwargs={"epsilon": 0.4, "is_weights": np.array([0.5, 1.0, 2.0, 1.5], np.float32)},
        ),
        np.array([0, 2, 0, 1]),
    )
)
def test_packed_matches_reference(impl: str, batch: PackedBatch) -> None:
    """Values, gradient and metrics of a packed call equal the float64 reference's on the same
    rows, for any segment lengths (empty segments are empty rows)."""
    assume(well_conditioned(batch.padded))
    out, grad = run_packed(batch, impl)
    exp = ref_packed(batch)
    scale = _scale(exp.per_sequence_loss)
    assert out.per_sequence_loss.shape == out.log_coef.shape == batch.advantages.shape
    assert grad.shape == batch.logp.shape
    assert_close(out.per_sequence_loss, exp.per_sequence_loss, torch.float32, "value", scale)
    assert_close(out.loss, exp.loss, torch.float32, "value", scale)
    assert_close(out.log_coef, exp.log_coef, torch.float32, "value", 10.0)
    assert_close(grad, exp.grad_logp, torch.float32, "grad", scale)
    _assert_metrics_match(out, exp, batch.padded)


@given(packed_batches(), st.data())
def test_packed_equals_padded(impl: str, batch: PackedBatch, data: st.DataObject) -> None:
    """packed == padded on the same rows: loss, per_sequence_loss, log_coef, the gradient of a
    random combination of all three, and every metric (float32 sums in another order). The
    padded call runs on the plain path (the compiled one equals it, tested above)."""
    padded = to_torch(batch.padded)
    packed = packed_to_torch(batch)
    s = len(batch.advantages)
    g = [torch.tensor(data.draw(st.lists(st.floats(-2, 2, width=32, allow_subnormal=False), min_size=n, max_size=n)),
                      dtype=torch.float32).reshape(shape)
         for n, shape in ((1, ()), (s, (s,)), (s, (s,)))]  # fmt: skip
    results = []
    for args, path in ((padded, "plain"), (packed, impl)):
        out = gmpo_loss(**args, impl=path)
        (grad,) = torch.autograd.grad((out.loss, out.per_sequence_loss, out.log_coef),
                                      args["logp"], g)  # fmt: skip
        results.append((out, grad))
    (pad_out, pad_grad), (pk_out, pk_grad) = results
    scale = float(max(1.0, pad_out.per_sequence_loss.abs().max().item()))
    assert_close(pk_out.loss, pad_out.loss, torch.float32, "value", scale)
    assert_close(pk_out.per_sequence_loss, pad_out.per_sequence_loss, torch.float32, "value", scale)
    assert_close(pk_out.log_coef, pad_out.log_coef, torch.float32, "value", 10.0)
    keep = np.arange(batch.padded.shape[1])[None, :] < np.diff(batch.cu_seqlens)[:, None]
    assert_close(pk_grad, pad_grad[torch.tensor(keep)], torch.float32, "grad", 4 * scale * s)
    assert pk_out.metrics.keys() == pad_out.metrics.keys()
    for k, v in pad_out.metrics.items():
        torch.testing.assert_close(
            pk_out.metrics[k], v, rtol=1e-5, atol=1e-6, equal_nan=True, msg=k
        )
    for field in ("num_tokens", "num_clipped_low", "num_clipped_high", "num_clipped_dual"):
        assert getattr(pk_out.stats, field) == getattr(pad_out.stats, field), field


@given(packed_batches(), garbage())
def test_packed_ignores_masked_tokens(impl: str, batch: PackedBatch, junk: float) -> None:
    """NaN, inf or huge values at masked packed tokens change nothing; their gradient is 0."""
    dirty = np.where(batch.mask, batch.logp, np.float32(junk)).astype(np.float32)
    old = np.where(batch.mask, batch.old_logp, np.float32(-junk)).astype(np.float32)
    out, grad = run_packed(batch, impl)
    out_d, grad_d = run_packed(PackedBatch(dirty, old, batch.advantages, batch.mask,
                                           batch.cu_seqlens, batch.kwargs, batch.padded), impl)  # fmt: skip
    assert torch.equal(out_d.per_sequence_loss, out.per_sequence_loss)
    assert torch.equal(grad_d, grad)
    assert torch.equal(grad_d[torch.tensor(~batch.mask)], torch.zeros(int((~batch.mask).sum())))


# ---------------------------------------------------------------------------------------------
# Rows split across ranks (process_group): every rank gets the whole rows' values
# ---------------------------------------------------------------------------------------------


class _ThreadGroup:
    """A stand-in process group for ranks that are threads of this process: ``all_reduce``
    (patched in below) exchanges the tensors through shared slots. The real collectives are
    tested with two gloo processes in tests/core/test_distributed.py."""

    def __init__(self, ranks: int) -> None:
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * ranks


def _thread_all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None) -> None:
    shared, rank = group
    shared.slots[rank] = tensor.clone()
    shared.barrier.wait()
    stacked = torch.stack(shared.slots)
    reduce = {torch.distributed.ReduceOp.SUM: torch.sum, torch.distributed.ReduceOp.MIN: torch.amin}
    result = reduce[op](stacked, 0)
    shared.barrier.wait()  # every rank has read the slots before any writes the next ones
    tensor.copy_(result)


@given(packed_batches(), st.integers(2, 3), st.data())
def test_split_across_ranks_equals_whole(
    batch: PackedBatch, ranks: int, data: st.DataObject
) -> None:
    """Each segment's tokens cut into ``ranks`` contiguous parts at drawn points (parts may be
    empty: a segment absent from a rank): every rank's loss, outputs and metrics are the whole
    call's, and its gradient the whole call's at its own tokens."""
    lengths = np.diff(batch.cu_seqlens)
    cuts = np.array([sorted(data.draw(st.lists(st.integers(0, int(n)), min_size=ranks - 1,
                                               max_size=ranks - 1))) for n in lengths],
                    np.int64).reshape(len(lengths), ranks - 1)  # fmt: skip
    whole_args = packed_to_torch(batch)
    whole = gmpo_loss(**whole_args)
    (whole_grad,) = torch.autograd.grad(whole.loss, whole_args["logp"])
    shared = _ThreadGroup(ranks)
    results: list[Any] = [None] * ranks

    def rank_call(rank: int, idx: np.ndarray, cu: np.ndarray) -> None:
        try:
            args = packed_to_torch(batch)
            index = torch.tensor(idx)
            for key in ("logp", "old_logp", "mask", "ref_logp", "is_weights"):
                if key in args and args[key].shape == whole_args["logp"].shape:
                    args[key] = args[key].detach()[index]
            args["logp"].requires_grad_()
            args["cu_seqlens"] = torch.tensor(cu)
            out = gmpo_loss(**args, process_group=(shared, rank))
            (grad,) = torch.autograd.grad(out.loss, args["logp"])
            results[rank] = (out, grad, index)
        except BaseException as e:  # reported below
            shared.barrier.abort()
            results[rank] = e

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.distributed, "all_reduce", _thread_all_reduce)
        threads = [threading.Thread(target=rank_call, args=(k, *part))
                   for k, part in enumerate(split_tokens(batch.cu_seqlens, cuts))]  # fmt: skip
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    scale = float(max(1.0, whole.per_sequence_loss.abs().max().item()))
    for res in results:
        assert not isinstance(res, BaseException), res
        out, grad, index = res
        assert_close(out.loss, whole.loss, torch.float32, "value", scale)
        assert_close(out.per_sequence_loss, whole.per_sequence_loss, torch.float32, "value", scale)
        assert_close(out.log_coef, whole.log_coef, torch.float32, "value", 10.0)
        assert_close(grad, whole_grad[index], torch.float32, "grad", scale)
        assert out.metrics.keys() == whole.metrics.keys()
        for k, v in whole.metrics.items():
            torch.testing.assert_close(
                out.metrics[k], v, rtol=1e-5, atol=1e-6, equal_nan=True, msg=k
            )
        assert out.stats.num_tokens == whole.stats.num_tokens
        assert out.stats.num_clipped_low == whole.stats.num_clipped_low
        assert out.stats.num_clipped_high == whole.stats.num_clipped_high


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
