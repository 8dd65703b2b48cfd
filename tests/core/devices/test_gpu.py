"""CUDA checks of the core (run by scripts/gpu.sh on a GPU machine; skipped cleanly here).

On CUDA each call runs under ``torch.cuda.set_sync_debug_mode("error")``, so any host-device
synchronization in the forward, the backward or ``out.metrics`` raises; the results are then
compared with the float64 reference. Options covered: KL, token and row weights (zero weights
included), dual clip, packed input (``cu_seqlens``), each path, float32 and bf16; and
``masked_power_mean``.

``GMPO_GPU_DRY_RUN=1`` (scripts/gpu.sh's dry run, in CI) runs these tests on the CPU without
a GPU: the same code, with no synchronization guard, so that the script is known to work before
a GPU is lent.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from gmpo_core import gmpo_loss, masked_power_mean, reference
from tests._helpers import ref
from tests._packed import ref_packed
from tests.strategies import Batch, pack

DRY_RUN = os.environ.get("GMPO_GPU_DRY_RUN", "") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() and not DRY_RUN,
        reason="needs a CUDA device (GMPO_GPU_DRY_RUN=1 runs it on the CPU, unguarded)",
    ),
]


def _synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def no_sync() -> Iterator[None]:
    """Any host-device synchronization raises inside (on CUDA; nothing to guard on the CPU)."""
    if DEVICE != "cuda":
        yield
        return
    _synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _batch(b: int, t: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    logp = (-rng.random((b, t)) * 3).astype(np.float32)
    old = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)
    lengths = rng.integers(0, t + 1, b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    adv = rng.normal(size=b).astype(np.float32)
    adv[0] = 0.0
    ref_logp = (logp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    return Batch(logp, old, adv, mask, {"epsilon": 0.4, "beta": 0.05, "ref_logp": ref_logp})


@pytest.mark.parametrize("impl", ["plain", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_reference_and_never_synchronizes(impl: str, dtype: torch.dtype) -> None:
    batch = _batch(64, 300, seed=1)
    dev = DEVICE
    logp = torch.tensor(batch.logp).to(dev, dtype).requires_grad_()
    args = dict(
        old_logp=torch.tensor(batch.old_logp).to(dev, dtype),
        advantages=torch.tensor(batch.advantages, device=dev),
        mask=torch.tensor(batch.mask, device=dev),
        ref_logp=torch.tensor(batch.kwargs["ref_logp"]).to(dev, dtype),
        beta=0.05,
    )
    gmpo_loss(logp, **args, impl=impl).loss.backward()  # warm-up: compile, cache the parameters
    logp.grad = None
    with no_sync():
        out = gmpo_loss(logp, **args, impl=impl)
        out.loss.backward()
        _ = out.metrics
    rounded = Batch(
        logp.detach().double().cpu().numpy(), args["old_logp"].double().cpu().numpy(),
        batch.advantages, batch.mask,
        {**batch.kwargs, "ref_logp": args["ref_logp"].double().cpu().numpy()},
    )  # fmt: skip
    exp = ref(rounded)
    torch.testing.assert_close(
        out.loss.double().cpu(), torch.tensor(exp.loss, dtype=torch.float64), rtol=2e-5, atol=1e-6
    )
    grad_tol = (
        {"rtol": 2e-5, "atol": 1e-8} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-8}
    )
    torch.testing.assert_close(logp.grad.double().cpu(), torch.tensor(exp.grad_logp), **grad_tol)
    assert logp.grad.dtype == dtype


# --------------------------------------------------------------------------------------------
# no synchronization with every option, padded and packed
# --------------------------------------------------------------------------------------------

B, T = 48, 200


def _options(name: str, rng: np.random.Generator) -> dict[str, Any]:
    kl = {"beta": 0.05, "ref_logp": (rng.normal(-1.5, 0.5, (B, T))).astype(np.float32)}
    w_tok = np.exp(rng.normal(0, 0.3, (B, T))).astype(np.float32)
    w_tok[rng.random((B, T)) < 0.1] = 0.0  # token_mask mode: zero weights remove tokens
    w_row = np.exp(rng.normal(0, 0.3, B)).astype(np.float32)
    options: dict[str, dict[str, Any]] = {
        "kl": kl,
        "token weights": {"is_weights": w_tok},
        "row weights": {"is_weights": w_row},
        "dual clip": {"dual_clip": 1.5},
        "all": {**kl, "is_weights": w_tok, "dual_clip": 1.5, "epsilon_high": 0.3},
    }
    return {"epsilon": 0.2, **options[name]}


SYNC_CASES = [
    # (options, packed, impl): every option on the plain path; everything at once on both paths
    *[(name, False, "plain") for name in ("kl", "token weights", "row weights", "dual clip")],
    *[("all", packed, impl) for packed in (False, True) for impl in ("plain", "compiled")],
    ("row weights", True, "plain"),
]


def _torch_args(arrays: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """gmpo_loss's arguments on DEVICE: float arrays in ``dtype`` (advantages and weights in
    float32), the mask bool, ``cu_seqlens`` int32; logp a leaf that requires grad."""
    out: dict[str, Any] = {}
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray):
            out[key] = value
            continue
        t = torch.tensor(value, device=DEVICE)
        if key in ("logp", "old_logp", "ref_logp"):
            t = t.to(dtype)
        elif key == "cu_seqlens":
            t = t.to(torch.int32)
        out[key] = t
    out["logp"].requires_grad_()
    return out


def _rounded(arrays: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """The float64 numpy arrays the kernel actually read (after the cast to ``dtype``)."""
    return {
        k: args[k].detach().double().cpu().numpy()
        if isinstance(v, np.ndarray) and k in ("logp", "old_logp", "ref_logp")
        else v
        for k, v in arrays.items()
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("options", "packed", "impl"), SYNC_CASES)
def test_no_synchronization_with_every_option(
    options: str, packed: bool, impl: str, dtype: torch.dtype
) -> None:
    """Forward, backward and ``out.metrics`` make no host-device synchronization with KL,
    weights, dual clip or packed input, and agree with the float64 reference."""
    rng = np.random.default_rng(7)
    batch = _batch(B, T, seed=2)
    batch = Batch(batch.logp, batch.old_logp, batch.advantages, batch.mask, _options(options, rng))
    if packed:
        lengths = rng.integers(0, T + 1, B)
        lengths[1] = 0  # an empty segment
        p = pack(batch, lengths)
        arrays: dict[str, Any] = {
            "logp": p.logp, "old_logp": p.old_logp, "advantages": p.advantages, "mask": p.mask,
            "cu_seqlens": p.cu_seqlens, **p.kwargs,
        }  # fmt: skip
    else:
        arrays = {"logp": batch.logp, "old_logp": batch.old_logp,
                  "advantages": batch.advantages, "mask": batch.mask, **batch.kwargs}  # fmt: skip
    args = _torch_args(arrays, dtype)
    gmpo_loss(**args, impl=impl).loss.backward()  # warm-up: compile, cache the parameters
    args["logp"].grad = None
    with no_sync():
        out = gmpo_loss(**args, impl=impl)
        out.loss.backward()
        metrics = out.metrics
    assert all(v.device.type == DEVICE for v in metrics.values())
    got = _rounded(arrays, args)
    if packed:
        exp = ref_packed(
            type(p)(got["logp"], got["old_logp"], p.advantages, p.mask, p.cu_seqlens,
                    {**p.kwargs, **{k: got[k] for k in p.kwargs if k == "ref_logp"}}, p.padded)
        )  # fmt: skip
    else:
        kw = {k: got[k] for k in batch.kwargs}
        exp = ref(Batch(got["logp"], got["old_logp"], batch.advantages, batch.mask, kw))
    scale = float(max(1.0, np.abs(exp.per_sequence_loss).max(initial=0.0)))
    torch.testing.assert_close(
        out.loss.double().cpu(), torch.tensor(exp.loss, dtype=torch.float64),
        rtol=2e-5, atol=1e-6 * scale,
    )  # fmt: skip
    grad_rtol = 2e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(
        args["logp"].grad.double().cpu(), torch.tensor(exp.grad_logp), rtol=grad_rtol, atol=1e-8
    )
    assert float(metrics["clip_ratio/region_mean"].cpu()) > 0  # the clip acts on these inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_power_mean_never_synchronizes(dtype: torch.dtype, packed: bool) -> None:
    """``masked_power_mean`` forward and backward at each branch (p > 0, 0, < 0, the expansion
    at tiny |p|), without a host-device synchronization, against the float64 reference."""
    batch = _batch(B, T, seed=3)
    x = torch.tensor(batch.logp - batch.old_logp).to(DEVICE, dtype) * 20  # |x| up to ~40
    mask = torch.tensor(batch.mask, device=DEVICE)
    held = x.double().cpu().numpy()
    seg: dict[str, Any] = {}
    if packed:
        cu = torch.zeros(B + 1, dtype=torch.int32)
        cu[1:] = torch.full((B,), T).cumsum(0)
        seg = {"cu_seqlens": cu.to(DEVICE)}
    for p in (2.0, 0.5, 0.0, -1.0, 1e-30):
        x_in = (x.reshape(-1) if packed else x).detach().requires_grad_()
        m_in = mask.reshape(-1) if packed else mask
        masked_power_mean(x_in, m_in, p, **seg).sum().backward()  # warm-up
        x_in.grad = None
        with no_sync():
            out = masked_power_mean(x_in, m_in, p, **seg)
            out.sum().backward()
        exp = reference.masked_power_mean(held, batch.mask, p)
        tol = 8 * 2.0**-23 * float(np.abs(held).max())
        np.testing.assert_allclose(out.detach().cpu().numpy(), exp.value, rtol=0, atol=tol)
        grad = x_in.grad.double().cpu().numpy().reshape(B, T)
        np.testing.assert_allclose(
            grad, exp.grad, rtol=8e-3 if dtype != torch.float32 else 1e-5, atol=1e-6
        )
