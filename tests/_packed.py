"""Helpers for packed (``cu_seqlens``) calls: running them, the reference, and splitting
segments' tokens across ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gmpo_core import GMPOOutput, reference
from tests._helpers import loss_and_grad, to_torch
from tests.strategies import PackedBatch


def packed_to_torch(batch: PackedBatch, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The packed batch as gmpo_loss arguments; logp is a leaf that requires grad."""
    return {**to_torch(batch, dtype), "cu_seqlens": torch.tensor(batch.cu_seqlens)}


def run_packed(
    batch: PackedBatch, impl: str, dtype: torch.dtype = torch.float32
) -> tuple[GMPOOutput, torch.Tensor]:
    """Forward, and the gradient of ``loss`` with respect to the packed ``logp``."""
    return loss_and_grad(packed_to_torch(batch, dtype), impl)


def ref_packed(batch: PackedBatch) -> reference.ReferenceResult:
    kw = {k: v.astype(np.float64) if isinstance(v, np.ndarray) else v
          for k, v in batch.kwargs.items()}  # fmt: skip
    return reference.gmpo_loss(
        batch.logp.astype(np.float64), batch.old_logp.astype(np.float64), batch.advantages,
        batch.mask, cu_seqlens=batch.cu_seqlens, **kw,
    )  # fmt: skip


def split_tokens(cu_seqlens: np.ndarray, cuts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each segment's tokens split along the token axis into ``len(cuts[0]) + 1`` contiguous
    parts, one per rank: ``cuts[i]`` (sorted, within the segment's length) are segment i's cut
    points. Returns per rank ``(token indices into the packed arrays, its cu_seqlens)``."""
    lengths = np.diff(cu_seqlens)
    ranks = cuts.shape[1] + 1
    out = []
    for k in range(ranks):
        idx, cu = [], [0]
        for i, length in enumerate(lengths):
            bounds = np.concatenate([[0], np.minimum(cuts[i], length), [length]])
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            idx.append(np.arange(lo, hi) + int(cu_seqlens[i]))
            cu.append(cu[-1] + hi - lo)
        out.append((np.concatenate(idx).astype(np.int64), np.array(cu, np.int64)))
    return out
