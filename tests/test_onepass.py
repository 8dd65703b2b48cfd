"""The hand-written one-pass CPU forward (gmpo_core._onepass) against the eager building blocks.

It replaces the compiled forward for float32 inputs without the KL term or per-token weights
where the forward writes the gradient, so everything it returns is checked here against eager
autograd: loss, per-row outputs, every statistic and metric, and the gradient, on row lengths
that are and are not multiples of the vector width, on rows the rules single out (empty, A = 0,
junk at masked positions, non-finite values at valid ones), on the multi-threaded path, and on
non-contiguous inputs. The property tests (test_properties.py) run it too, through
``impl="compiled"``.
"""

from __future__ import annotations

import pytest
import torch

from gmpo_core import fused, gmpo_loss

EPS_LOW, EPS_HIGH, DUAL = 0.2, 0.28, 3.0


@pytest.fixture(scope="module")
def kernels() -> fused.Kernels:
    return fused.compile_kernels()


def _case(b: int, t: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g) * 3
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = 0  # an empty row
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(b, generator=g)
    adv[1 % b] = 0.0  # an A = 0 row (the empty row when b == 1)
    old = logp + 0.4 * torch.randn(b, t, generator=g)
    # junk where the mask is 0: must not matter
    logp = torch.where(mask, logp, torch.full_like(logp, float("nan")))
    old = torch.where(mask, old, torch.full_like(old, float("-inf")))
    return {"logp": logp.requires_grad_(), "old_logp": old, "advantages": adv, "mask": mask}


def _run(
    x: dict[str, torch.Tensor], kernels: fused.Kernels, dual: bool, w_row: torch.Tensor | None
) -> tuple[object, torch.Tensor, object, torch.Tensor]:
    """(one-pass output, its gradient, eager output, eager gradient); asserts the kernel ran."""
    assert kernels.onepass is not None
    calls = kernels.onepass.calls
    log_dual = float(torch.log(torch.tensor(DUAL))) if dual else None
    out = fused.fused_gmpo(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], None, None, w_row,
        EPS_LOW, EPS_HIGH, log_dual, 0.0, strict=True, kernels=kernels,
    )  # fmt: skip
    assert kernels.onepass.calls == calls + 1
    (grad,) = torch.autograd.grad(out.loss, x["logp"])
    ref = gmpo_loss(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH, dual_clip=DUAL if dual else None, is_weights=w_row, impl="eager",
    )  # fmt: skip
    (ref_grad,) = torch.autograd.grad(ref.loss, x["logp"])
    return out, grad, ref, ref_grad


def _assert_equal_outputs(out, grad, ref, ref_grad) -> None:  # type: ignore[no-untyped-def]
    close = {"rtol": 1e-6, "atol": 1e-7, "equal_nan": True}
    torch.testing.assert_close(out.loss, ref.loss, **close)
    torch.testing.assert_close(out.per_sequence_loss, ref.per_sequence_loss, **close)
    torch.testing.assert_close(out.log_coef, ref.log_coef, **close)
    torch.testing.assert_close(grad, ref_grad, **close)
    for field in ("num_tokens", "num_clipped_low", "num_clipped_high", "num_clipped_dual"):
        a, b = getattr(out.stats, field), getattr(ref.stats, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert a.dtype == b.dtype == torch.int64 and int(a) == int(b), field
    for field in ("row_clip_low", "row_clip_high", "log_ratio_min", "log_ratio_max"):
        torch.testing.assert_close(getattr(out.stats, field), getattr(ref.stats, field), **close)
    assert torch.equal(out.stats.row_nonempty, ref.stats.row_nonempty)
    assert out.metrics.keys() == ref.metrics.keys()
    for key in ref.metrics:
        torch.testing.assert_close(out.metrics[key], ref.metrics[key], **close, msg=key)


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("row_weights", [False, True])
@pytest.mark.parametrize("b,t", [(1, 1), (2, 5), (3, 16), (7, 17), (5, 40), (4, 129)])
def test_onepass_equals_eager(
    kernels: fused.Kernels, b: int, t: int, dual: bool, row_weights: bool
) -> None:
    x = _case(b, t, seed=b * 1000 + t)
    w_row = torch.rand(b, generator=torch.Generator().manual_seed(t)) + 0.5 if row_weights else None
    out, grad, ref, ref_grad = _run(x, kernels, dual, w_row)
    _assert_equal_outputs(out, grad, ref, ref_grad)
    # the case is not degenerate: clipping happened and some gradient is non-zero
    if b * t >= 40:
        assert int(ref.stats.num_clipped_low) + int(ref.stats.num_clipped_high) > 0
        assert ref_grad.abs().sum() > 0


def test_onepass_multithreaded_rows_equal_eager(kernels: fused.Kernels) -> None:
    """Above the parallel threshold (2^15 tokens) rows are split across threads."""
    x = _case(9, 4099, seed=5)
    _assert_equal_outputs(*_run(x, kernels, dual=True, w_row=None))


@pytest.mark.parametrize("where", ["nan logp", "inf log-ratio", "-inf log-ratio"])
def test_onepass_non_finite_values_at_valid_positions_match_eager(
    kernels: fused.Kernels, where: str
) -> None:
    """What torch's clamp, sum and amin do with a non-finite log-ratio at a valid position (NaN
    spreads to the row's loss and the extrema; +-inf is clipped or not), the kernel does too."""
    x = _case(4, 37, seed=7)
    logp = x["logp"].detach().clone()
    row, col = 2, 0
    assert x["mask"][row, col]
    if where == "nan logp":
        logp[row, col] = float("nan")
    elif where == "inf log-ratio":
        x["old_logp"][row, col] = float("-inf")
    else:
        logp[row, col] = float("-inf")
    x["logp"] = logp.requires_grad_()
    for adv in (1.0, -1.0):
        x["advantages"][row] = adv
        _assert_equal_outputs(*_run(x, kernels, dual=True, w_row=None))


def test_onepass_non_contiguous_inputs_and_uint8_mask(kernels: fused.Kernels) -> None:
    """Strided inputs are made contiguous; a uint8 mask counts every non-zero byte as valid."""
    x = _case(6, 50, seed=9)
    wide = torch.zeros(6, 100)
    wide[:, 1::2] = x["old_logp"]
    x["old_logp"] = wide[:, 1::2]
    assert not x["old_logp"].is_contiguous()
    x["mask"] = x["mask"].to(torch.uint8) * 3
    _assert_equal_outputs(*_run(x, kernels, dual=False, w_row=None))


def test_a_failed_build_leaves_the_compiled_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the C++ kernel cannot be built, the Inductor forward runs, with the same results."""
    from torch._inductor import codecache

    def fail(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("no compiler")

    monkeypatch.setattr(codecache.CppPythonBindingsCodeCache, "load_pybinding", fail)
    kernels = fused.compile_kernels()
    assert kernels.onepass is not None
    x = _case(3, 20, seed=11)
    out = fused.fused_gmpo(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], None, None, None,
        EPS_LOW, EPS_HIGH, None, 0.0, strict=True, kernels=kernels,
    )  # fmt: skip
    assert kernels.onepass.failed and kernels.onepass.calls == 0
    assert isinstance(kernels.forward, fused._Direct) and kernels.forward.cache
    (grad,) = torch.autograd.grad(out.loss, x["logp"])
    ref = gmpo_loss(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH, impl="eager",
    )  # fmt: skip
    (ref_grad,) = torch.autograd.grad(ref.loss, x["logp"])
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(grad, ref_grad)


def test_onepass_values_exactly_on_a_bound_are_not_clipped(kernels: fused.Kernels) -> None:
    """A log-ratio equal to a bound (in float32) passes the clamp: not counted, gradient kept."""
    x = _case(4, 24, seed=13)
    x["mask"][:] = True
    x["advantages"] = torch.tensor([-1.0, 1.0, -2.0, 0.5])
    old = torch.zeros(4, 24)
    logp = torch.rand(4, 24, generator=torch.Generator().manual_seed(1)) * 0.2 - 0.1  # inside
    lo = -torch.tensor(EPS_LOW, dtype=torch.float32)
    hi = torch.tensor(EPS_HIGH, dtype=torch.float32)
    logp[0, :5], logp[2, :3], logp[1, :4], logp[3, :2] = lo, lo, hi, hi
    x["old_logp"], x["logp"] = old, logp.requires_grad_()
    out, grad, ref, ref_grad = _run(x, kernels, dual=False, w_row=None)
    assert int(ref.stats.num_clipped_low) == int(ref.stats.num_clipped_high) == 0
    assert (ref_grad != 0).all()
    _assert_equal_outputs(out, grad, ref, ref_grad)


def test_onepass_row_extremes_skip_empty_rows(kernels: fused.Kernels) -> None:
    """The min/max of the per-row clip fractions is over non-empty rows only: an empty row's
    zero fraction does not count."""
    x = _case(5, 30, seed=17)
    x["logp"] = torch.nan_to_num(x["logp"].detach(), nan=-1.0).requires_grad_()
    x["mask"][:] = True
    x["mask"][3] = False  # the only empty row
    x["advantages"] = -torch.rand(5) - 0.5  # every row clips low...
    old = x["old_logp"].clone()
    old[:, 0] = x["logp"].detach()[:, 0] + 1.0  # ...at its first token at least
    x["old_logp"] = old
    out, grad, ref, ref_grad = _run(x, kernels, dual=False, w_row=None)
    assert 0 < float(ref.metrics["clip_ratio/low_min"]) < 1
    _assert_equal_outputs(out, grad, ref, ref_grad)


@pytest.mark.parametrize("b,t", [(3, 16), (7, 17), (4, 129), (9, 4099)])
def test_onepass_streaming_stores_equal_eager(
    kernels: fused.Kernels, monkeypatch: pytest.MonkeyPatch, b: int, t: int
) -> None:
    """Large gradients are written with streaming stores (aligned full vectors; the rest with
    plain ones): forced here at small sizes, rows aligned or not."""
    from gmpo_core import _onepass

    monkeypatch.setattr(_onepass, "STREAM_TOKENS", 0)
    x = _case(b, t, seed=b + t)
    _assert_equal_outputs(*_run(x, kernels, dual=True, w_row=torch.rand(b) + 0.5))
