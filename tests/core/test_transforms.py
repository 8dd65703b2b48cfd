"""The loss under torch's transforms: activation checkpointing and ``torch.func`` (grad, jacrev,
vmap of grad: per-sample gradients) and ``torch.autograd.functional.jacobian`` with
``vectorize=True``. Each must give autograd's own answer, on both impls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from gmpo_core import gmpo_loss

B, T = 4, 6
# gmpo_core tells a transformed call by torch.func.debug_unwrap (public API only)
needs_debug_unwrap = pytest.mark.skipif(
    not hasattr(torch.func, "debug_unwrap"),
    reason=f"torch {torch.__version__} has no torch.func.debug_unwrap, the public API gmpo_core "
    "tells a torch.func transform by",
)
DT = torch.float64


def _inputs(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=DT) * 2
    mask = torch.rand(B, T, generator=g) > 0.2
    mask[1] = False  # an empty row
    return {
        "logp": logp,
        "old_logp": logp + 0.4 * torch.randn(B, T, generator=g, dtype=DT),
        "advantages": torch.tensor([1.0, -1.0, -0.5, 2.0], dtype=DT),
        "mask": mask,
        "ref_logp": logp - 0.3 * torch.rand(B, T, generator=g, dtype=DT),
        "beta": 0.05,
        "dual_clip": 2.0,
        "epsilon": 0.2,
    }


def _loss(x: dict[str, Any], impl: str) -> Callable[[torch.Tensor], torch.Tensor]:
    rest = {k: v for k, v in x.items() if k != "logp"}
    return lambda logp: gmpo_loss(logp, **rest, impl=impl).loss


def _per_sequence(x: dict[str, Any], impl: str) -> Callable[[torch.Tensor], torch.Tensor]:
    rest = {k: v for k, v in x.items() if k != "logp"}
    return lambda logp: gmpo_loss(logp, **rest, impl=impl).per_sequence_loss


def _autograd(f: Callable[[torch.Tensor], torch.Tensor], logp: torch.Tensor) -> torch.Tensor:
    leaf = logp.clone().requires_grad_()
    (grad,) = torch.autograd.grad(f(leaf), leaf)
    return grad


def _jacobian_rows(x: dict[str, Any]) -> torch.Tensor:
    """d per_sequence_loss_i / d logp, row by row, by autograd."""
    f = _per_sequence(x, "plain")
    rows = []
    for i in range(B):
        leaf = x["logp"].clone().requires_grad_()
        (grad,) = torch.autograd.grad(f(leaf)[i], leaf)
        rows.append(grad)
    return torch.stack(rows)


def test_checkpoint(impl: str) -> None:
    """Defect: with ``use_reentrant=False`` the backward read ``ctx.saved_tensors`` twice and
    failed: "Unpack is being triggered for a tensor that was already unpacked once"."""
    x = _inputs()
    f = _loss(x, impl)
    leaf = x["logp"].clone().requires_grad_()
    (grad,) = torch.autograd.grad(checkpoint(f, leaf, use_reentrant=False), leaf)
    torch.testing.assert_close(grad, _autograd(_loss(x, "plain"), x["logp"]))


@needs_debug_unwrap
def test_func_grad(impl: str) -> None:
    """Defect: torch.func.grad raised "must override the setup_context staticmethod"."""
    x = _inputs()
    got = torch.func.grad(_loss(x, impl))(x["logp"])
    torch.testing.assert_close(got, _autograd(_loss(x, "plain"), x["logp"]))


@needs_debug_unwrap
def test_func_jacrev(impl: str) -> None:
    x = _inputs()
    torch.testing.assert_close(
        torch.func.jacrev(_per_sequence(x, impl))(x["logp"]), _jacobian_rows(x)
    )


@needs_debug_unwrap
def test_per_sample_gradients_with_vmap(impl: str) -> None:
    """``vmap(grad(f))`` over a stack of batches: each batch's own gradient."""
    x = _inputs()
    stack = torch.stack([x["logp"], x["logp"] + 0.3, x["logp"] - 0.5])
    got = torch.func.vmap(torch.func.grad(_loss(x, impl)))(stack)
    want = torch.stack([_autograd(_loss(x, "plain"), s) for s in stack])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("output", ["loss", "per_sequence_loss"])
def test_vectorized_jacobian(impl: str, output: str) -> None:
    """Defect: ``jacobian(..., vectorize=True)`` on ``per_sequence_loss`` raised "vmap:
    aten::mul_ ... not possible" (the backward scaled a batched upstream gradient in place)."""
    x = _inputs()
    f = _per_sequence(x, impl) if output == "per_sequence_loss" else _loss(x, impl)
    got = torch.autograd.functional.jacobian(f, x["logp"], vectorize=True)
    want = _jacobian_rows(x) if output == "per_sequence_loss" else _autograd(f, x["logp"])
    torch.testing.assert_close(got, want)


def test_no_gradient_is_written_without_a_backward(
    impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: under ``torch.no_grad()`` with a ``logp`` that requires grad, the forward still
    wrote the whole (B, T) gradient. The math is asked for it only where a backward can come."""
    from gmpo_core import _math, compiled, loss

    asked: list[bool] = []

    def spy(kernel: Callable[..., Any]) -> Callable[..., Any]:
        def run(b: Any, h: Any, with_grad: bool, across: Any = None) -> Any:
            asked.append(with_grad)
            return kernel(b, h, with_grad, across)

        return run

    monkeypatch.setattr(loss._math, "forward", spy(_math.forward))
    monkeypatch.setattr(loss.compiled, "kernel", lambda: spy(compiled._serialized))
    x = _inputs()
    logp = x.pop("logp").clone().requires_grad_()
    with torch.no_grad():
        gmpo_loss(logp, **x, impl=impl)
    gmpo_loss(logp, **x, impl=impl).loss.backward()
    gmpo_loss(logp.detach(), **x, impl=impl)
    assert asked == [False, True, False]


def test_docstring_states_the_second_order_gradient() -> None:
    """Defect: the docstring said the compiled path "has no second-order gradient"; it has one
    (S14): a Hessian-vector product through it equals the plain path's."""
    assert "no second-order" not in (gmpo_loss.__doc__ or "")
    x = _inputs()
    v = torch.randn(B, T, dtype=DT, generator=torch.Generator().manual_seed(1))
    hvps = []
    for impl in ("plain", "compiled"):
        leaf = x["logp"].clone().requires_grad_()
        (g,) = torch.autograd.grad(_loss(x, impl)(leaf), leaf, create_graph=True)
        (hvp,) = torch.autograd.grad((g * v).sum(), leaf)
        hvps.append(hvp)
    assert hvps[0].abs().sum() > 0  # the KL term has curvature
    torch.testing.assert_close(hvps[1], hvps[0])


def _layout(x: dict[str, Any], layout: str) -> dict[str, Any]:
    """The batch as given (padded), or its rows packed: every row's T tokens, with its mask."""
    if layout == "padded":
        return dict(x)
    flat = {k: v.reshape(-1) if isinstance(v, torch.Tensor) and v.shape == (B, T) else v
            for k, v in x.items()}  # fmt: skip
    return {**flat, "cu_seqlens": torch.arange(B + 1) * T}


def _jvp_by_rows(x: dict[str, Any], v: torch.Tensor) -> list[torch.Tensor]:
    """J v of ``loss``, ``per_sequence_loss`` and ``log_coef`` by reverse-mode autograd of the
    padded plain path, one output element at a time."""
    rest = {k: val for k, val in x.items() if k != "logp"}
    leaf = x["logp"].clone().requires_grad_()
    out = gmpo_loss(leaf, **rest)
    result = []
    for o in (out.loss.reshape(1), out.per_sequence_loss, out.log_coef):
        rows = [torch.autograd.grad(o[i], leaf, retain_graph=True)[0] for i in range(len(o))]
        result.append(torch.stack([(r * v).sum() for r in rows]))
    result[0] = result[0].reshape(())
    return result


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_forward_ad_dual_tensors(impl: str, layout: str) -> None:
    """(CHANGELOG, 0.2): ``torch.autograd.forward_ad`` dual tensors got torch's "You must
    implement the jvp function for custom autograd.Function to use it with forward mode AD"
    (``torch.func.jvp`` worked). A dual ``logp`` runs the math under autograd, as a
    ``torch.func`` transform does: the tangents of ``loss``, ``per_sequence_loss`` and
    ``log_coef`` are J v, and the primals the plain call's values."""
    from torch.autograd import forward_ad

    x = _inputs()
    v = torch.randn(B, T, dtype=DT, generator=torch.Generator().manual_seed(2))
    want = _jvp_by_rows(x, v)
    p = _layout(x, layout)
    logp = p.pop("logp")
    with forward_ad.dual_level():
        out = gmpo_loss(forward_ad.make_dual(logp, v.reshape(logp.shape)), **p, impl=impl)
        outputs = (out.loss, out.per_sequence_loss, out.log_coef)
        duals = [forward_ad.unpack_dual(t) for t in outputs]
    plain = gmpo_loss(logp, **p)
    primals = (plain.loss, plain.per_sequence_loss, plain.log_coef)
    for d, w, primal in zip(duals, want, primals, strict=True):
        assert d.tangent is not None
        torch.testing.assert_close(d.tangent, w)
        torch.testing.assert_close(d.primal, primal)
    assert want[1].abs().sum() > 0


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("output", ["loss", "per_sequence_loss"])
def test_forward_mode_jacobian(impl: str, layout: str, output: str) -> None:
    """(CHANGELOG, 0.2): ``jacobian(..., strategy="forward-mode", vectorize=True)`` raised
    "You must implement the jvp function"."""
    x = _inputs()
    p = _layout(x, layout)
    logp = p.pop("logp")

    def f(lp: torch.Tensor) -> torch.Tensor:
        out = gmpo_loss(lp, **p, impl=impl)  # type: ignore[arg-type]
        return out.loss if output == "loss" else out.per_sequence_loss

    got = torch.autograd.functional.jacobian(f, logp, strategy="forward-mode", vectorize=True)
    rows = _jacobian_rows(x)  # (B, B, T)
    want = _autograd(_loss(x, "plain"), x["logp"]) if output == "loss" else rows
    torch.testing.assert_close(got, want.reshape(got.shape))
