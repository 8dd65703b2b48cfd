"""The compiled path (``impl="compiled"``) and ``gmpo_loss`` inside a user's ``torch.compile``:
no graph break, one compilation across shapes, the same values and gradients as the plain path."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from gmpo_core import _math, compiled, gmpo_loss


def _inputs(b: int, t: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g).to(dtype)
    mask = torch.rand(b, t, generator=g) > 0.2
    mask[0] = False  # an empty row
    adv = torch.randn(b, generator=g)
    adv[-1] = 0.0  # an A = 0 row
    return {
        "logp": logp.requires_grad_(),
        "old_logp": (logp.detach().float() + 0.5 * torch.randn(b, t, generator=g)).to(dtype),
        "advantages": adv,
        "mask": mask,
    }


def test_compiled_forward_compiles_once_across_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamic=True: one graph serves every (B, T); a batch with a size 1 runs uncompiled (it
    would be specialized); fullgraph=True turns any graph break into an error."""
    counter = CompileCounter()
    fresh = functools.cache(
        lambda: torch.compile(_math.forward, dynamic=True, fullgraph=True, backend=counter)
    )
    monkeypatch.setattr(compiled, "compiled_forward", fresh)
    for b, t in ((3, 5), (4, 17), (1, 9), (9, 64), (5, 1), (2, 300), (16, 33)):
        x = _inputs(b, t)
        out = gmpo_loss(**x, impl="compiled", epsilon_high=0.28)
        out.loss.backward()
    assert counter.frame_count == 1


@pytest.mark.parametrize("impl", ["plain", "compiled"])
def test_loss_traces_into_a_user_graph_without_breaks(impl: str) -> None:
    """A user who compiles the whole step gets the math traced into the step's graph, whatever
    ``impl`` says, with the same values and gradients."""
    counter = CompileCounter()

    def step(x: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        out = gmpo_loss(**x, impl=impl, beta=0.04, epsilon_high=0.28)  # type: ignore[arg-type]
        return out.loss, out.metrics["clip_ratio/high_mean"]

    fn = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for b, t in ((3, 8), (5, 13)):
        x = _inputs(b, t, seed=b)
        x["ref_logp"] = x["old_logp"] - 0.1
        loss, high = fn(x)
        (grad,) = torch.autograd.grad(loss, x["logp"])
        expected = gmpo_loss(**x, impl="plain", beta=0.04, epsilon_high=0.28)  # type: ignore[arg-type]
        (expected_grad,) = torch.autograd.grad(expected.loss, x["logp"])
        torch.testing.assert_close(loss, expected.loss)
        torch.testing.assert_close(high, expected.metrics["clip_ratio/high_mean"])
        torch.testing.assert_close(grad, expected_grad)
    assert counter.frame_count == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weights", [None, "row", "token"])
@pytest.mark.parametrize("extra", ["none", "dual clip", "kl"])
def test_compiled_equals_plain_for_any_upstream_gradient(
    dtype: torch.dtype, weights: str | None, extra: str
) -> None:
    """Forward values, metrics, and the gradient for random upstream gradients of all three
    differentiable outputs (loss, per_sequence_loss, log_coef)."""
    x = _inputs(6, 20, seed=1, dtype=dtype)
    kw: dict[str, Any] = {"epsilon": 0.3, "epsilon_high": 0.5}
    if weights == "row":
        kw["is_weights"] = torch.rand(6) + 0.5
    elif weights == "token":
        w = torch.rand(6, 20) + 0.5
        w[1, :3] = 0.0  # dropped tokens
        kw["is_weights"] = w
    if extra == "dual clip":
        kw["dual_clip"] = 1.3
    elif extra == "kl":
        kw.update(beta=0.1, ref_logp=x["old_logp"] - 0.2)
    g = torch.Generator().manual_seed(2)
    ups = (torch.randn((), generator=g), torch.randn(6, generator=g), torch.randn(6, generator=g))
    results = []
    for impl in ("plain", "compiled"):
        out = gmpo_loss(**x, impl=impl, **kw)  # type: ignore[arg-type]
        outputs = (out.loss, out.per_sequence_loss, out.log_coef)
        (grad,) = torch.autograd.grad(outputs, x["logp"], ups)
        results.append((out, grad))
    (plain, plain_grad), (comp, comp_grad) = results
    assert comp_grad.dtype == dtype
    torch.testing.assert_close(comp.per_sequence_loss, plain.per_sequence_loss)
    torch.testing.assert_close(comp.log_coef, plain.log_coef)
    torch.testing.assert_close(comp_grad, plain_grad)
    assert comp.metrics.keys() == plain.metrics.keys()
    for key, value in plain.metrics.items():
        torch.testing.assert_close(comp.metrics[key], value, equal_nan=True)


@pytest.mark.parametrize("impl", ["plain", "compiled"])
@pytest.mark.parametrize("used", ["loss", "per_sequence_loss", "log_coef", "log_coef+loss"])
def test_backward_with_only_some_outputs_used(impl: str, used: str) -> None:
    """Outputs that do not reach the objective get no gradient (None): read as zero, as
    autograd of the math itself does (the traced path is the expectation)."""
    x = _inputs(5, 9, seed=3)
    kw: dict[str, Any] = {"beta": 0.2, "ref_logp": x["old_logp"] - 0.3}

    def objective(out: Any) -> torch.Tensor:
        parts = {"loss": out.loss, "per_sequence_loss": out.per_sequence_loss.sum()}
        parts["log_coef"] = out.log_coef.square().sum()
        return sum(parts[p] for p in used.split("+"))  # type: ignore[return-value]

    (grad,) = torch.autograd.grad(objective(gmpo_loss(**x, impl=impl, **kw)), x["logp"])
    b = _math.Batch(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], kw["ref_logp"], None, None
    )
    fw = _math.forward(b, _math.Hyper(0.4, 0.4, None, 0.2))  # under autograd
    expected = objective(fw)
    (expected_grad,) = torch.autograd.grad(expected, x["logp"])
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("impl", ["plain", "compiled"])
def test_retain_graph_backward_twice(impl: str) -> None:
    x = _inputs(4, 10, seed=4)
    out = gmpo_loss(**x, impl=impl)
    out.loss.backward(retain_graph=True)
    first = x["logp"].grad.clone()
    out.loss.backward()
    torch.testing.assert_close(x["logp"].grad, 2 * first)


@pytest.mark.parametrize("impl", ["plain", "compiled"])
def test_scaled_loss(impl: str) -> None:
    """An upstream gradient of ``loss`` other than 1 (gradient accumulation divides the loss)."""
    x = _inputs(4, 10, seed=5)
    (grad,) = torch.autograd.grad(gmpo_loss(**x, impl=impl).loss * 0.25, x["logp"])
    (unit,) = torch.autograd.grad(gmpo_loss(**x, impl=impl).loss, x["logp"])
    assert unit.abs().sum() > 0
    torch.testing.assert_close(grad, 0.25 * unit)


@pytest.mark.parametrize("impl", ["plain", "compiled"])
@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.int32, torch.int64, torch.float16])
def test_mask_of_any_dtype_equals_a_bool_mask(impl: str, mask_dtype: torch.dtype) -> None:
    """A 0/1 mask of any dtype selects the same tokens as the bool mask (S6). The compiled path
    reads integer masks as numbers (:func:`gmpo_core._math.valid_tokens`)."""
    x = _inputs(5, 12, seed=6)
    kw: dict[str, Any] = {"epsilon_high": 0.28, "dual_clip": 2.0, "is_weights": torch.rand(5, 12)}
    expected = gmpo_loss(**x, impl="plain", **kw)
    (expected_grad,) = torch.autograd.grad(expected.loss, x["logp"])
    out = gmpo_loss(**{**x, "mask": x["mask"].to(mask_dtype)}, impl=impl, **kw)  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(out.loss, x["logp"])
    torch.testing.assert_close(out.per_sequence_loss, expected.per_sequence_loss)
    torch.testing.assert_close(grad, expected_grad)
    for key, value in expected.metrics.items():
        torch.testing.assert_close(out.metrics[key], value, equal_nan=True)


def test_compiled_kernel_reads_a_bool_mask_as_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bool mask reaches the compiled forward as a zero-copy uint8 view: compiled CPU code
    loads a bool tensor ~5x slower than bytes (docs/api.md), which made the kernel 2x slower."""
    seen: list[torch.Tensor] = []

    def record(b: _math.Batch, *args: Any) -> _math.Forward:
        seen.append(b.mask)
        return _math.forward(b, *args)

    monkeypatch.setattr(compiled, "compiled_forward", lambda: record)
    x = _inputs(3, 7)
    gmpo_loss(**x, impl="compiled").loss.backward()
    assert len(seen) == 1
    assert seen[0].dtype == torch.uint8
    assert seen[0].data_ptr() == x["mask"].data_ptr()
