"""``token_logprobs`` on the ``meta`` device: device-generic without a GPU.

A meta tensor has no values: a host read raises, and so does mixing with a CPU tensor. So a
forward and backward that run end to end on meta tensors read nothing back to the host and make
no constant on the CPU, which is what a CUDA step needs (docs/api.md, "Devices").
"""

from __future__ import annotations

import pytest
import torch

from gmpo_core import token_logprobs

N_LEAD, V, H = (2, 5), 11, 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("entropy", [False, True])
def test_forward_and_backward_on_meta(dtype: torch.dtype, bias: bool, entropy: bool) -> None:
    """Regression: the forward entered ``torch.autocast("meta", enabled=False)``, which raises
    "RuntimeError: unsupported scalarType" (meta has no autocast); the context is now entered
    only where ``torch.amp.is_autocast_available`` says the device type has one."""
    meta = {"device": "meta", "dtype": dtype}
    hidden = torch.empty(*N_LEAD, H, **meta, requires_grad=True)
    weight = torch.empty(V, H, **meta, requires_grad=True)
    b = torch.empty(V, **meta, requires_grad=True) if bias else None
    targets = torch.empty(N_LEAD, dtype=torch.long, device="meta")
    out = token_logprobs(
        hidden, weight, targets, bias=b, temperature=0.7, logit_scale=1.5, chunk_size=3,
        compute_entropy=entropy,
    )  # fmt: skip
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    assert out.logps.is_meta and out.logps.shape == N_LEAD and out.logps.dtype == compute
    if entropy:
        assert out.entropies is not None
        assert out.entropies.is_meta and out.entropies.shape == N_LEAD
        total = out.logps.sum() + out.entropies.sum()
    else:
        assert out.entropies is None
        total = out.logps.sum()
    total.backward()
    params = [hidden, weight] + ([b] if b is not None else [])
    for p in params:
        assert p.grad is not None and p.grad.is_meta
        assert p.grad.shape == p.shape and p.grad.dtype == dtype


def test_meta_under_a_cpu_autocast() -> None:
    """A CPU autocast context around a meta call leaves the head in float32."""
    hidden = torch.empty(4, H, device="meta", requires_grad=True)
    weight = torch.empty(V, H, device="meta", requires_grad=True)
    targets = torch.empty(4, dtype=torch.long, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logps, entropies = token_logprobs(hidden, weight, targets)
    assert logps.dtype == torch.float32 and logps.is_meta
    assert entropies is not None
    (logps.sum() + entropies.sum()).backward()
    assert hidden.grad is not None and hidden.grad.is_meta


def test_no_tokens_on_meta() -> None:
    hidden = torch.empty(0, H, device="meta", requires_grad=True)
    weight = torch.empty(V, H, device="meta", requires_grad=True)
    logps, entropies = token_logprobs(
        hidden, weight, torch.empty(0, dtype=torch.long, device="meta")
    )
    assert logps.is_meta and logps.shape == (0,)
    assert entropies is not None
    logps.sum().backward()
    assert weight.grad is not None and weight.grad.is_meta
