"""CUDA checks of the core (run by benchmarks/gpu.sh on a GPU machine; skipped cleanly here)."""

from __future__ import annotations

import pytest
import torch

from gmpo_core import gmpo_loss
from tests._helpers import ref
from tests.strategies import Batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _batch(b: int, t: int, seed: int) -> Batch:
    import numpy as np

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
    dev = "cuda"
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
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host-device synchronization raises
    try:
        out = gmpo_loss(logp, **args, impl=impl)
        out.loss.backward()
        _ = out.metrics
    finally:
        torch.cuda.set_sync_debug_mode("default")
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
