"""The plain path's working memory: how many (B, T) tensors its forward+backward holds at once."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gmpo_core import gmpo_loss


class _LiveFull(TorchDispatchMode):
    """Counts the (B, T)-sized tensors that ops create and that are alive at once (views and
    the inputs are not counted)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.live, self.peak = numel, 0, 0
        self.names: list[str] = []

    def _dead(self) -> None:
        self.live -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else [out]:
            is_new = isinstance(o, torch.Tensor) and o._base is None
            if is_new and o.numel() >= self.numel and func is not torch.ops.aten.detach.default:
                self.live += 1
                weakref.finalize(o, self._dead)
                self.names.append(str(func))
        self.peak = max(self.peak, self.live)
        return out


@pytest.mark.parametrize("extra", ["none", "kl"])
def test_plain_path_holds_few_full_size_tensors(extra: str) -> None:
    """At most 6 (B, T) tensors alive at once (8 with the KL term), the gradient included: the
    0/1 mask, r, q, the clipped q and two temporaries. Dead tensors are dropped before the
    gradient's temporaries are made; before that, the path held 8 (11 with KL): 32 MiB beyond
    its inputs at 256x4096 instead of 24 (results/figures-bench/loss_cpu.md)."""
    b, t = 16, 64
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(b, t, generator=g)).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) > 0.2
    kw: dict[str, Any] = {}
    if extra == "kl":
        kw = {"beta": 0.04, "ref_logp": old - 0.1}
    with _LiveFull(b * t) as mode:
        out = gmpo_loss(logp, old, torch.randn(b, generator=g), mask, **kw)
        _ = out.metrics
        out.loss.backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
    assert mode.peak <= (6 if extra == "none" else 8), mode.names
