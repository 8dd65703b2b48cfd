"""The compiled path: no graph break, few compilations across shapes, equal to eager."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

from gmpo_core import fused, gmpo_loss

SHAPES = [(2, 3), (4, 16), (3, 7), (8, 64), (5, 33), (16, 128), (7, 9)]


def _inputs(
    b: int, t: int, seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g) * 3).to(dtype).requires_grad_()
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    return {
        "logp": logp,
        "old_logp": (logp.detach().float() + 0.5 * torch.randn(b, t, generator=g)).to(dtype),
        "advantages": torch.randn(b, generator=g),
        "mask": torch.arange(t)[None, :] < lengths[:, None],
        "ref_logp": (logp.detach().float() + 0.3 * torch.randn(b, t, generator=g)).to(dtype),
    }


def test_fused_kernels_compile_without_graph_breaks_and_few_recompilations() -> None:
    """fullgraph=True turns any graph break into an error; the counters bound recompilations."""
    torch._dynamo.reset()
    fwd, bwd = CompileCounterWithBackend("inductor"), CompileCounterWithBackend("inductor")
    kernels = fused.Kernels(
        fused.compile_kernels(fwd).forward, fused.compile_kernels(bwd).backward, compiled=True
    )
    for i, (b, t) in enumerate(SHAPES):
        x = _inputs(b, t, seed=i)
        out = fused.fused_gmpo(
            x["logp"], x["old_logp"], x["advantages"], x["mask"], x["ref_logp"], None, None,
            0.4, 0.4, None, 0.04, strict=True, kernels=kernels,
        )  # fmt: skip
        # log_coef's gradient takes the backward kernel (loss alone: the forward wrote it)
        (out.loss + out.log_coef.sum()).backward()
        assert torch.isfinite(x["logp"].grad).all()
    assert len(SHAPES) >= 6
    assert 1 <= fwd.frame_count <= 3, fwd.frame_count
    assert 1 <= bwd.frame_count <= 3, bwd.frame_count


@pytest.mark.parametrize("impl", ["auto", "compiled"])
def test_eager_path_traces_into_a_user_graph_without_breaks(impl: str) -> None:
    """Users who compile their whole step get the building blocks traced with it, whatever
    ``impl`` they asked for (the fused path's autograd function is not traceable)."""
    torch._dynamo.reset()
    cnt = CompileCounter()
    loss_fn = functools.partial(gmpo_loss, impl=impl, beta=0.04, epsilon_high=0.28)

    @torch.compile(backend=cnt, dynamic=True, fullgraph=True)
    def step(logp, old_logp, advantages, mask, ref_logp):  # type: ignore[no-untyped-def]
        out = loss_fn(logp, old_logp, advantages, mask, ref_logp=ref_logp)
        return out.loss, out.stats.num_clipped_high

    for i, (b, t) in enumerate(SHAPES):
        x = _inputs(b, t, seed=i)
        loss, _ = step(**x)
        (grad,) = torch.autograd.grad(loss, x["logp"])
        expected = gmpo_loss(**x, impl="eager", beta=0.04, epsilon_high=0.28)  # type: ignore[arg-type]
        (want,) = torch.autograd.grad(expected.loss, x["logp"])
        torch.testing.assert_close(loss, expected.loss, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-7)
    assert cnt.frame_count <= 3, cnt.frame_count
    assert cnt.op_count > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weights", [None, "row", "token"])
@pytest.mark.parametrize("dual_clip", [None, 2.0])
def test_compiled_equals_eager_forward_and_backward(
    dtype: torch.dtype, weights: str | None, dual_clip: float | None
) -> None:
    b, t = 6, 40
    x = _inputs(b, t, seed=7, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    kw: dict[str, object] = {
        "beta": 0.1,
        "ref_logp": x.pop("ref_logp"),
        "dual_clip": dual_clip,
        "epsilon_high": 0.3,
    }
    if weights == "row":
        kw["is_weights"] = torch.rand(b, generator=g) * 2
    elif weights == "token":
        kw["is_weights"] = torch.where(
            torch.rand(b, t, generator=g) < 0.2, 0.0, torch.rand(b, t, generator=g) + 0.5
        )
    upstream_ps, upstream_lc = torch.randn(b, generator=g), torch.randn(b, generator=g)
    results = {}
    for impl in ("eager", "compiled"):
        out = gmpo_loss(**x, impl=impl, **kw)  # type: ignore[arg-type]
        total = (out.per_sequence_loss * upstream_ps).sum() + (out.log_coef * upstream_lc).sum()
        (grad,) = torch.autograd.grad(total, x["logp"])
        results[impl] = (out, grad)
    (e, ge), (c, gc) = results["eager"], results["compiled"]
    torch.testing.assert_close(c.per_sequence_loss, e.per_sequence_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(c.log_coef, e.log_coef, rtol=1e-6, atol=1e-6)
    tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-6}
    torch.testing.assert_close(gc, ge, **tol)
    assert gc.dtype == dtype
    assert c.metrics.keys() == e.metrics.keys()
    for k in e.metrics:
        torch.testing.assert_close(
            c.metrics[k], e.metrics[k], rtol=1e-6, atol=1e-7, equal_nan=True, msg=k
        )


def test_compile_failure_is_a_clear_error_or_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """impl='compiled' raises a clear error; impl='auto' falls back to the eager kernels once."""

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise torch._dynamo.exc.BackendCompilerFailed(lambda *a: None, RuntimeError("no compiler"))  # type: ignore[arg-type]

    monkeypatch.setattr(fused, "_default_kernels", fused.Kernels(broken, broken, compiled=True))
    x = _inputs(4, 8, seed=1)
    x.pop("ref_logp")
    with pytest.raises(RuntimeError, match=r"impl='compiled'.*torch.compile failed.*impl='eager'"):
        gmpo_loss(**x, impl="compiled")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = gmpo_loss(**x, impl="auto")
        out.loss.backward()
        out2 = gmpo_loss(**x, impl="auto")
    assert [
        str(w.message) for w in caught if "torch.compile failed" in str(w.message)
    ].__len__() == 1
    assert fused._default_kernels is fused.EAGER_KERNELS
    expected = gmpo_loss(**x, impl="eager")
    torch.testing.assert_close(out2.loss, expected.loss)


# the variants the hand-written one-pass CPU forward covers (float32, no KL, no token weights)
ONEPASS_VARIANTS = {"plain", "row weights", "dual clip"}

VARIANTS = {
    "plain": {},
    "kl": {"beta": 0.1},
    "token weights": {"is_weights": "token"},
    "row weights": {"is_weights": "row"},
    "dual clip": {"dual_clip": 2.0, "epsilon_high": 0.3},
    "bf16": {"dtype": torch.bfloat16, "beta": 0.1},
    "float64": {"dtype": torch.float64},
}


def _variant_case(
    variant: str, b: int, t: int, seed: int
) -> tuple[dict[str, torch.Tensor], dict[str, object], torch.Tensor]:
    """Inputs, gmpo_loss keywords and a random (B,) upstream gradient for one of VARIANTS."""
    kw = dict(VARIANTS[variant])
    x = _inputs(b, t, seed=seed, dtype=kw.pop("dtype", torch.float32))  # type: ignore[arg-type]
    ref = x.pop("ref_logp")
    if kw.get("beta"):
        kw["ref_logp"] = ref
    g = torch.Generator().manual_seed(seed + 1)
    if kw.get("is_weights") == "token":
        kw["is_weights"] = torch.where(
            torch.rand(b, t, generator=g) < 0.2, 0.0, torch.rand(b, t, generator=g) + 0.5
        )
    elif kw.get("is_weights") == "row":
        kw["is_weights"] = torch.rand(b, generator=g) + 0.5
    return x, kw, torch.randn(b, generator=g)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_default_kernels_run_without_dynamo_and_equal_eager(variant: str) -> None:
    """The default compiled kernels are Inductor code called directly (no Dynamo frame, no
    fallback) for every input signature, on non-contiguous inputs too, and equal the eager
    path forward and backward."""
    b, t = 6, 40
    x, kw, upstream = _variant_case(variant, b, t, seed=11)
    dtype = x["logp"].dtype
    # a non-contiguous old_logp (a column slice of a wider tensor)
    wide = torch.zeros(b, 2 * t, dtype=dtype)
    wide[:, ::2] = x["old_logp"]
    x["old_logp"] = wide[:, ::2]
    assert not x["old_logp"].is_contiguous()
    results = {}
    kernels = fused.default_kernels()
    assert kernels.onepass is not None
    onepass_calls = kernels.onepass.calls
    for impl in ("eager", "compiled"):
        out = gmpo_loss(**x, impl=impl, **kw)  # type: ignore[arg-type]
        total = out.loss + (out.per_sequence_loss * upstream).sum() + out.log_coef.sum()
        (grad,) = torch.autograd.grad(total, x["logp"])
        results[impl] = (out, grad)
    # the one-pass kernel ran for the variants it covers, the compiled forward for the others
    assert kernels.onepass.calls == onepass_calls + (variant in ONEPASS_VARIANTS)
    for direct in (kernels.forward, kernels.backward):
        assert isinstance(direct, fused._Direct)
        assert all(c is not None for c in direct.cache.values()), direct.cache
    assert kernels.backward.cache
    assert variant in ONEPASS_VARIANTS or kernels.forward.cache
    (e, ge), (c, gc) = results["eager"], results["compiled"]
    tol = {"rtol": 8e-3, "atol": 1e-6} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-7}
    torch.testing.assert_close(c.per_sequence_loss, e.per_sequence_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gc, ge, **tol)
    assert gc.dtype == dtype and c.loss.dtype == e.loss.dtype
    for k in e.metrics:
        torch.testing.assert_close(c.metrics[k], e.metrics[k], equal_nan=True, msg=k)


def test_direct_path_checks_the_size_guards_of_its_code() -> None:
    """Code compiled under a size assumption (here the trace takes a branch on T) is only called
    where the assumption holds: other sizes get their own variant, and each stays right."""

    def kernel(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        return x * params[0] if x.shape[1] > 6 else x * params[1]

    direct = fused._Direct(kernel)
    params = torch.tensor([2.0, 3.0, 0.0, 0.0])
    wide, narrow = torch.ones(3, 10), torch.ones(3, 4)
    assert torch.equal(direct(wide, params), wide * 2)
    assert torch.equal(direct(narrow, params), narrow * 3)
    assert torch.equal(direct(torch.ones(5, 12), params), torch.full((5, 12), 2.0))
    (variants,) = direct.cache.values()
    assert variants is not None and len(variants) == 2
    wide_check, narrow_check = (check for check, _ in variants)
    assert wide_check(3, 7) and not wide_check(3, 6)
    assert narrow_check(3, 6) and not narrow_check(3, 7)


def test_direct_path_falls_back_when_tracing_specializes_a_size() -> None:
    """A size the trace turns into a constant cannot be guarded as (B, T): torch.compile runs it."""

    def kernel(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        return x * float(x.shape[1]) * params[0]  # float() turns the size into a constant

    direct = fused._Direct(kernel)
    params = torch.tensor([2.0, 3.0, 0.0, 0.0])
    x = torch.arange(12.0).reshape(2, 6)
    assert torch.equal(direct(x, params), x * 6 * 2)
    assert list(direct.cache.values()) == [None]
    assert torch.equal(direct(torch.ones(3, 5), params), torch.full((3, 5), 10.0))


def test_default_kernels_compile_once_across_shapes() -> None:
    """Symbolic sizes: one compiled variant per kernel serves every (B, T) below Inductor's
    size thresholds (7 shapes here)."""
    kernels = fused.compile_kernels()._replace(onepass=None)  # the Inductor kernels alone
    for i, (b, t) in enumerate(SHAPES):
        x = _inputs(b, t, seed=i)
        out = fused.fused_gmpo(
            x["logp"], x["old_logp"], x["advantages"], x["mask"], None, None, None,
            0.4, 0.4, None, 0.0, strict=True, kernels=kernels,
        )  # fmt: skip
        (out.loss + out.log_coef.sum()).backward()  # log_coef: the backward kernel runs
        expected = gmpo_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"], impl="eager")
        torch.testing.assert_close(out.loss, expected.loss)
    for direct in (kernels.forward, kernels.backward):
        assert isinstance(direct, fused._Direct)
        (variants,) = direct.cache.values()
        assert variants is not None and len(variants) == 1


def test_small_and_large_batches_get_their_own_compiled_code() -> None:
    """Inductor chooses serial or parallel code from the sizes it compiles for: a first call on a
    tiny batch must not decide for the large ones (and both stay equal to eager)."""
    kernels = fused.compile_kernels()._replace(onepass=None)  # the Inductor kernels alone
    for b, t in [(2, 16), (64, 1024), (4, 8), (128, 1024)]:
        x = _inputs(b, t, seed=b)
        out = fused.fused_gmpo(
            x["logp"], x["old_logp"], x["advantages"], x["mask"], None, None, None,
            0.4, 0.4, None, 0.0, strict=True, kernels=kernels,
        )  # fmt: skip
        expected = gmpo_loss(x["logp"], x["old_logp"], x["advantages"], x["mask"], impl="eager")
        torch.testing.assert_close(out.loss, expected.loss)
    (variants,) = kernels.forward.cache.values()
    assert variants is not None and len(variants) == 2
    small, large = (check for check, _ in variants)
    assert small(4, 8) and not small(64, 1024)
    assert large(64, 1024) and not large(2, 16)


@pytest.mark.parametrize("used", ["loss", "per_sequence_loss", "log_coef", "log_coef+loss"])
def test_backward_with_only_some_outputs_used(used: str) -> None:
    """Outputs that do not reach the objective get no gradient tensor from autograd (None): the
    fused backward reads them as zero, like eager autograd does (KL term included)."""
    x = _inputs(5, 24, seed=21)
    grads = {}
    for impl in ("eager", "compiled"):
        out = gmpo_loss(**x, beta=0.2, impl=impl)  # type: ignore[arg-type]
        terms = {
            "loss": out.loss,
            "per_sequence_loss": (out.per_sequence_loss * torch.arange(5.0)).sum(),
            "log_coef": (out.log_coef * torch.arange(5.0)).sum(),
        }
        objective = sum(terms[k] for k in used.split("+"))
        (grads[impl],) = torch.autograd.grad(objective, x["logp"])
    torch.testing.assert_close(grads["compiled"], grads["eager"], rtol=1e-6, atol=1e-7)
    assert grads["eager"].abs().sum() > 0


SPECULATIVE_OBJECTIVES = {
    "loss": lambda o, w: o.loss,
    "scaled loss": lambda o, w: o.loss * 0.25,  # say, divided by the accumulation steps
    "per_sequence_loss": lambda o, w: (o.per_sequence_loss * w).sum(),
    "loss+per_sequence_loss": lambda o, w: 3.0 * o.loss + (o.per_sequence_loss * w).sum(),
}


@pytest.fixture(scope="module")
def fresh_kernels() -> fused.Kernels:
    """Default-style kernels of this module's own (one compilation per input signature)."""
    return fused.compile_kernels()


@pytest.mark.parametrize("objective", list(SPECULATIVE_OBJECTIVES))
@pytest.mark.parametrize("variant", ["plain", "kl", "token weights", "row weights", "dual clip"])
def test_gradient_written_by_the_forward_equals_eager(
    objective: str, variant: str, fresh_kernels: fused.Kernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where only ``loss`` and ``per_sequence_loss`` reach the objective, the gradient the
    forward kernel wrote (scaled per row in the backward) is the result, the backward kernel is
    never called, and it equals eager autograd's."""
    x, kw, upstream = _variant_case(variant, 6, 40, seed=13)
    kernels = fresh_kernels
    monkeypatch.setattr(fused, "_default_kernels", kernels)
    assert kernels.onepass is not None
    onepass_calls = kernels.onepass.calls
    grads = {}
    for impl in ("eager", "compiled"):
        out = gmpo_loss(**x, impl=impl, **kw)  # type: ignore[arg-type]
        (grads[impl],) = torch.autograd.grad(
            SPECULATIVE_OBJECTIVES[objective](out, upstream), x["logp"]
        )
    assert not kernels.backward.cache  # the backward kernel never ran
    # the forward that wrote the gradient: the one-pass kernel where it applies
    assert kernels.onepass.calls == onepass_calls + (variant in ONEPASS_VARIANTS)
    assert variant in ONEPASS_VARIANTS or kernels.forward.cache
    torch.testing.assert_close(grads["compiled"], grads["eager"], rtol=1e-6, atol=1e-7)
    assert grads["eager"].abs().sum() > 0


def test_gradient_written_by_the_forward_survives_retain_graph() -> None:
    """A second backward through the same graph (retain_graph) recomputes the gradient: the
    first one consumed the forward's buffer."""
    x = _inputs(5, 24, seed=23)
    out = gmpo_loss(**x, beta=0.1, impl="compiled")  # type: ignore[arg-type]
    (first,) = torch.autograd.grad(out.loss * 0.5, x["logp"], retain_graph=True)
    (second,) = torch.autograd.grad(out.loss * 0.5, x["logp"])
    expected = gmpo_loss(**x, beta=0.1, impl="eager")  # type: ignore[arg-type]
    (want,) = torch.autograd.grad(expected.loss * 0.5, x["logp"])
    torch.testing.assert_close(first, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(second, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["no_grad", "bf16", "logp without grad"])
def test_forward_writes_no_gradient_where_none_is_needed_or_exact(case: str) -> None:
    """No gradient is written by the forward without a backward to come, nor for low-precision
    log-probs (scaling it in the backward would round twice): the backward kernel serves those."""
    kernels = fused.compile_kernels()
    calls: list[bool] = []
    forward = kernels.forward

    def spy(*args):  # type: ignore[no-untyped-def]
        calls.append(args[-1])  # ``speculate``
        return forward(*args)

    kernels = kernels._replace(forward=spy)
    x = _inputs(4, 16, seed=29, dtype=torch.bfloat16 if case == "bf16" else torch.float32)
    if case == "logp without grad":
        x["logp"] = x["logp"].detach()
    args = (x["logp"], x["old_logp"], x["advantages"], x["mask"], None, None, None)
    with torch.set_grad_enabled(case != "no_grad"):
        out = fused.fused_gmpo(*args, 0.2, 0.2, None, 0.0, strict=True, kernels=kernels)
    assert calls == [False]
    if case == "bf16":
        (grad,) = torch.autograd.grad(out.loss, x["logp"])
        expected = gmpo_loss(*args[:4], epsilon=0.2, impl="eager")  # type: ignore[misc]
        (want,) = torch.autograd.grad(expected.loss, x["logp"])
        torch.testing.assert_close(grad, want, rtol=8e-3, atol=1e-6)
