"""Shared test helpers: running both implementations on a drawn batch, and the tolerance table."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch

from gmpo_core import GMPOOutput, gmpo_loss, reference
from tests.strategies import Batch

#: The device of the core's device-generic tests (those that call :func:`loss_and_grad`, e.g.
#: tests/core/test_properties*.py): ``GMPO_TEST_DEVICE``, default ``cpu``; scripts/gpu.sh sets
#: ``cuda``. Inputs are built on the CPU and moved; results come back to the CPU to be compared.
TEST_DEVICE = torch.device(os.environ.get("GMPO_TEST_DEVICE") or "cpu")

# One tolerance table per dtype: (rtol, atol) for values, and for gradients. atol for values is
# multiplied by the scale of the terms summed (a sum is only as exact as its largest term).
TOL: dict[torch.dtype, dict[str, tuple[float, float]]] = {
    torch.float64: {"value": (1e-12, 1e-13), "grad": (1e-12, 1e-15)},
    torch.float32: {"value": (2e-5, 1e-6), "grad": (2e-5, 1e-8)},
    torch.bfloat16: {"value": (2e-5, 1e-6), "grad": (8e-3, 1e-8)},
    torch.float16: {"value": (2e-5, 1e-6), "grad": (1e-3, 1e-7)},
}


def to_torch(batch: Any, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The batch as gmpo_loss arguments; logp is a leaf that requires grad."""
    t = lambda a: torch.tensor(a).to(dtype)  # noqa: E731
    args: dict[str, Any] = {
        "logp": t(batch.logp).requires_grad_(),
        "old_logp": t(batch.old_logp),
        "advantages": torch.tensor(batch.advantages),
        "mask": torch.tensor(batch.mask),
    }
    for k, v in batch.kwargs.items():
        args[k] = t(v) if isinstance(v, np.ndarray) else v
    return args


def rounded(batch: Batch, dtype: torch.dtype) -> Batch:
    """The batch with its floating arrays rounded to ``dtype`` (what the kernel actually reads)."""
    r = lambda a: torch.tensor(a).to(dtype).to(torch.float64).numpy()  # noqa: E731
    kw = {k: r(v) if isinstance(v, np.ndarray) else v for k, v in batch.kwargs.items()}
    return Batch(r(batch.logp), r(batch.old_logp), batch.advantages, batch.mask, kw)


def run(
    batch: Batch, impl: str, dtype: torch.dtype = torch.float32
) -> tuple[GMPOOutput, torch.Tensor]:
    """Forward, and the gradient of ``loss`` with respect to ``logp``."""
    return loss_and_grad(to_torch(batch, dtype), impl)


def loss_and_grad(args: dict[str, Any], impl: str) -> tuple[GMPOOutput, torch.Tensor]:
    """``gmpo_loss(**args)``, and the gradient of its ``loss`` with respect to ``args["logp"]``.

    Computed on :data:`TEST_DEVICE`: the inputs are moved there (differentiably) and the outputs
    come back to the CPU, so the tests that go through here run unchanged on any device.
    """
    on_device = {
        k: v.to(TEST_DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()
    }
    out = gmpo_loss(**on_device, impl=impl)
    (grad,) = torch.autograd.grad(out.loss, args["logp"])
    return _to_cpu(out), grad


def _to_cpu(out: GMPOOutput) -> GMPOOutput:
    def cpu(t: torch.Tensor | None) -> Any:
        return None if t is None else t.cpu()

    tally = type(out._tally)(*(cpu(f) for f in out._tally))
    return dataclasses.replace(
        out, loss=cpu(out.loss), per_sequence_loss=cpu(out.per_sequence_loss),
        log_coef=cpu(out.log_coef), _tally=tally, kl_sum=cpu(out.kl_sum),
    )  # fmt: skip


def ref(batch: Batch) -> reference.ReferenceResult:
    return reference.gmpo_loss(
        batch.logp.astype(np.float64), batch.old_logp.astype(np.float64), batch.advantages, batch.mask,
        **batch.kwargs,
    )  # fmt: skip


def assert_close(
    actual: Any, expected: Any, dtype: torch.dtype, kind: str, scale: float = 1.0
) -> None:
    rtol, atol = TOL[dtype][kind]
    a = actual.detach().double().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().double().numpy()
    np.testing.assert_allclose(
        a, np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol * scale
    )


def valid_log_ratio(batch: Batch) -> np.ndarray:
    """r at the valid positions (zero-weight tokens excluded), as float64."""
    r = batch.logp.astype(np.float64) - batch.old_logp.astype(np.float64)
    valid = batch.mask.copy()
    w = batch.kwargs.get("is_weights")
    if w is not None and w.ndim == 2 and w.shape[1] > 1:
        valid &= w != 0
    return r[valid]


def well_conditioned(batch: Batch, margin: float = 1e-4) -> bool:
    """No valid log-ratio within ``margin`` of a clip bound (where float32 and float64 may
    legitimately disagree about which side of the bound a token is on)."""
    kw = batch.kwargs
    bounds = [-kw["epsilon"], kw.get("epsilon_high") or kw["epsilon"]]
    if kw.get("dual_clip") is not None:
        bounds.append(float(np.log(kw["dual_clip"])))
    r = valid_log_ratio(batch)
    return all(np.all(np.abs(r - b) > margin) for b in bounds)


def random_inputs(
    b: int = 3, t: int = 6, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A small random ``gmpo_loss`` batch: ``logp`` (requires grad), ``old_logp`` within about
    0.5 of it, ``advantages``, and a mask with about a fifth of the tokens left out."""
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g, dtype=torch.float64) * 2).to(dtype)
    return {
        "logp": logp.requires_grad_(),
        "old_logp": (logp.detach() + 0.5 * torch.randn(b, t, generator=g, dtype=dtype)),
        "advantages": torch.randn(b, generator=g, dtype=dtype),
        "mask": torch.rand(b, t, generator=g) > 0.2,
    }


def loss_inputs(
    b: int, t: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """gmpo_loss inputs of (b, t) in ``dtype``: random log-probs and drift, an empty first row, an
    A = 0 last row; ``logp`` a leaf that requires grad."""
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
