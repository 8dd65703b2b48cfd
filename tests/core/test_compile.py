"""The compiled path (``impl="compiled"``) and ``gmpo_loss`` inside a user's ``torch.compile``:
no graph break, one compilation across shapes, the same values and gradients as the plain path."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from gmpo_core import _math, compiled, gmpo_loss, masked_power_mean
from tests import _helpers
from tests._helpers import loss_inputs


def test_compiled_forward_compiles_once_across_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamic=True: one graph serves every (B, T); a batch with a size 1 runs uncompiled (it
    would be specialized); fullgraph=True turns any graph break into an error."""
    counter = CompileCounter()
    fresh = functools.cache(
        lambda: torch.compile(_math.forward, dynamic=True, fullgraph=True, backend=counter)
    )
    monkeypatch.setattr(compiled, "compiled_forward", fresh)
    for b, t in ((3, 5), (4, 17), (1, 9), (9, 64), (5, 1), (2, 300), (16, 33)):
        x = loss_inputs(b, t)
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
        x = loss_inputs(b, t, seed=b)
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
    x = loss_inputs(6, 20, seed=1, dtype=dtype)
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
    x = loss_inputs(5, 9, seed=3)
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
    x = loss_inputs(4, 10, seed=4)
    out = gmpo_loss(**x, impl=impl)
    out.loss.backward(retain_graph=True)
    first = x["logp"].grad.clone()
    out.loss.backward()
    torch.testing.assert_close(x["logp"].grad, 2 * first)


@pytest.mark.parametrize("impl", ["plain", "compiled"])
def test_scaled_loss(impl: str) -> None:
    """An upstream gradient of ``loss`` other than 1 (gradient accumulation divides the loss)."""
    x = loss_inputs(4, 10, seed=5)
    (grad,) = torch.autograd.grad(gmpo_loss(**x, impl=impl).loss * 0.25, x["logp"])
    (unit,) = torch.autograd.grad(gmpo_loss(**x, impl=impl).loss, x["logp"])
    assert unit.abs().sum() > 0
    torch.testing.assert_close(grad, 0.25 * unit)


@pytest.mark.parametrize("impl", ["plain", "compiled"])
@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.int32, torch.int64, torch.float16])
def test_mask_of_any_dtype_equals_a_bool_mask(impl: str, mask_dtype: torch.dtype) -> None:
    """A 0/1 mask of any dtype selects the same tokens as the bool mask (S6). The compiled path
    reads integer masks as numbers (:func:`gmpo_core._math.valid_tokens`)."""
    x = loss_inputs(5, 12, seed=6)
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
    x = loss_inputs(3, 7)
    gmpo_loss(**x, impl="compiled").loss.backward()
    assert len(seen) == 1
    assert seen[0].dtype == torch.uint8
    assert seen[0].data_ptr() == x["mask"].data_ptr()


# Regression, defect 2 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): a first call under torch.inference_mode() broke later training calls (a cached
# tensor).
def test_first_call_under_inference_mode_then_training(impl: str) -> None:
    x = _helpers.random_inputs(seed=2)
    with torch.inference_mode():
        gmpo_loss(**{**x, "logp": x["logp"].detach()}, epsilon=0.31, impl=impl)
    out = gmpo_loss(**x, epsilon=0.31, impl=impl)
    (grad,) = torch.autograd.grad(out.loss, x["logp"])
    expected = gmpo_loss(**x, epsilon=0.31, impl="plain")
    (expected_grad,) = torch.autograd.grad(expected.loss, x["logp"])
    torch.testing.assert_close(grad, expected_grad)


# Regression, defect 4 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): advantages that require grad got a gradient on some paths: advantages are
# constants everywhere.
@pytest.mark.parametrize("user_compile", [False, True])
def test_advantages_get_no_gradient(impl: str, user_compile: bool) -> None:
    x = _helpers.random_inputs(seed=5)
    value = torch.randn(3, requires_grad=True)
    x["advantages"] = x["advantages"] - value  # A = R - V with a trainable V

    def step(**kw: Any) -> torch.Tensor:
        return gmpo_loss(**kw, impl=impl).loss

    fn = torch.compile(step, backend="eager", fullgraph=True) if user_compile else step
    loss = fn(**x)
    loss.backward()
    assert value.grad is None
    assert x["logp"].grad is not None and x["logp"].grad.abs().sum() > 0


# Regression, defect 5 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): threads making first calls at once raced in tracing; one failing call switched the
# process to the slow path for good. The compiled path's calls take turns; nothing flips.
def test_threads_making_first_calls_at_once() -> None:
    """Four threads compile one input signature that no other test uses, at once."""
    results: list[Any] = [None] * 4
    errors: list[BaseException] = []
    kw: dict[str, Any] = {"dual_clip": 1.7, "beta": 0.2}

    def work(i: int) -> None:
        try:
            x = _helpers.random_inputs(b=3 + i, t=7 + i, seed=i, dtype=torch.float64)
            x["is_weights"] = torch.rand(3 + i, 7 + i, dtype=torch.float64) + 0.5
            x["ref_logp"] = x["old_logp"] - 0.1
            out = gmpo_loss(**x, **kw, impl="compiled")
            (grad,) = torch.autograd.grad(out.loss, x["logp"])
            results[i] = (x, out.loss.detach(), grad)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for x, loss, grad in results:
        expected = gmpo_loss(**x, **kw, impl="plain")
        (expected_grad,) = torch.autograd.grad(expected.loss, x["logp"])
        torch.testing.assert_close(loss, expected.loss.detach())
        torch.testing.assert_close(grad, expected_grad)


def test_a_failing_call_changes_nothing_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    real = compiled.kernel()
    calls = {"n": 0}

    def flaky(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated: out of memory")
        return real(*args)

    monkeypatch.setattr(compiled, "kernel", lambda: flaky)
    x = _helpers.random_inputs(seed=6)
    with pytest.raises(RuntimeError, match="simulated: out of memory"):
        gmpo_loss(**x, impl="compiled")
    out = gmpo_loss(**x, impl="compiled")  # the compiled kernel again, not a fallback
    assert calls["n"] == 2
    torch.testing.assert_close(out.loss, gmpo_loss(**x, impl="plain").loss)


# Regression, defect 6 and 12 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): an uncreatable TORCHINDUCTOR_CACHE_DIR broke every default call; `python -W
# error` made the default path raise (Inductor's deprecation warning).
_DEFAULT_CALL = """
import torch
from gmpo_core import gmpo_loss
logp = torch.randn(2, 5).requires_grad_()
out = gmpo_loss(logp, logp.detach() + 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 5), impl={impl!r})
out.loss.backward()
print("ok", out.loss.item(), {{k: v.item() for k, v in out.metrics.items()}})
"""


def test_default_path_ignores_an_unusable_inductor_cache() -> None:
    env = {"TORCHINDUCTOR_CACHE_DIR": "/proc/gmpo-cannot-create/here", "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", _DEFAULT_CALL.format(impl="plain")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")


def test_default_path_runs_clean_with_warnings_as_errors() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _DEFAULT_CALL.format(impl="plain")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


# Regression, defect 7 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): out.metrics inside torch.compile(fullgraph=True) failed (a cached_property lock).
def test_metrics_trace_into_one_graph(impl: str) -> None:
    counter = CompileCounter()

    def step(**kw: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = gmpo_loss(**kw, impl=impl, dual_clip=2.0)
        return out.loss, dict(out.metrics)

    x = _helpers.random_inputs(seed=7)
    loss, metrics = torch.compile(step, backend=counter, fullgraph=True)(**x)
    assert counter.frame_count == 1
    expected = gmpo_loss(**x, impl="plain", dual_clip=2.0)
    torch.testing.assert_close(loss, expected.loss)
    assert metrics.keys() == expected.metrics.keys()
    for k, v in expected.metrics.items():
        torch.testing.assert_close(metrics[k], v, equal_nan=True)


@pytest.mark.parametrize("backend", ["counter", "inductor"])
def test_power_mean_traces_without_breaks(backend: str) -> None:
    """``masked_power_mean`` in a user's ``torch.compile(fullgraph=True)``: no graph break, one
    graph across shapes for a fixed p, at most one per p when p is an argument (its sign, 0 and
    the expansion are chosen in Python; torch 2.4 specializes on every float), the eager values
    and gradients. Inductor compiles the fixed p only (seconds a graph)."""
    counters = (CompileCounter(), CompileCounter())
    compilers: tuple[Any, Any] = counters if backend == "counter" else ("inductor", "inductor")

    def fixed(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_power_mean(x, mask, -1.0)

    def given_p(x: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
        return masked_power_mean(x, mask, p)

    fixed_c = torch.compile(fixed, backend=compilers[0], fullgraph=True, dynamic=True)
    given_c = torch.compile(given_p, backend=compilers[1], fullgraph=True, dynamic=True)
    powers = (0.5, 2.0, -1.0, 0.0, 1e-30) if backend == "counter" else ()
    for b, t in ((3, 8), (5, 13), (4, 2)):
        g = torch.Generator().manual_seed(b)
        x = (torch.randn(b, t, generator=g) * 10).requires_grad_()
        mask = torch.rand(b, t, generator=g) > 0.3
        mask[0] = False  # an empty row
        for fn, eager, p in [(fixed_c, fixed, None), *[(given_c, given_p, q) for q in powers]]:
            extra = () if p is None else (p,)
            out = fn(x, mask, *extra)
            expected = eager(x, mask, *extra)
            torch.testing.assert_close(out, expected)
            ups = torch.randn(b, generator=g)
            (grad,) = torch.autograd.grad(out, x, ups)
            (expected_grad,) = torch.autograd.grad(expected, x, ups)
            torch.testing.assert_close(grad, expected_grad)
    if backend == "counter":
        assert counters[0].frame_count == 1
        assert 1 <= counters[1].frame_count <= len(powers)
