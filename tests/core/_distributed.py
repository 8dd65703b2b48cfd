"""What the ``process_group=`` tests share (test_distributed.py, test_rank_agreement.py): the
world size, the cases split across two gloo ranks, a rank's shard of them, and the spawn."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from tests._packed import split_tokens

WORLD = 2
DT = torch.float64
KW: dict[str, Any] = {"epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.05, "dual_clip": 2.0}


def split_case(name: str) -> dict[str, Any]:
    """A packed batch (float64) with every option, and per segment the rank-0/rank-1 cut."""
    g = torch.Generator().manual_seed(7)
    if name == "no tokens on rank 1":
        lengths = np.array([3, 0, 5])
        cuts = lengths[:, None].copy()  # everything on rank 0
    else:
        # segment 2 has no token on rank 0, segment 4 none on rank 1, segment 3 is empty
        lengths = np.array([6, 9, 4, 0, 7, 1])
        cuts = np.array([[2], [7], [0], [0], [7], [1]])
    n = int(lengths.sum())
    logp = -torch.rand(n, generator=g, dtype=DT) * 2
    out = {
        "logp": logp,
        "old_logp": logp + 0.6 * torch.randn(n, generator=g, dtype=DT),
        "advantages": torch.tensor([1.0, -1.5, 0.7, 2.0, -0.3, 0.0][: len(lengths)], dtype=DT),
        "mask": torch.rand(n, generator=g) > 0.15,
        "ref_logp": logp - 0.3 * torch.rand(n, generator=g, dtype=DT),
        "is_weights": torch.rand(n, generator=g, dtype=DT) + 0.5,
        "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32),
        "cuts": cuts,
    }
    out["is_weights"][3] = 0.0  # a dropped token
    return out


def shard(x: dict[str, Any], rank: int) -> tuple[dict[str, Any], torch.Tensor]:
    """This rank's tokens of every segment, and their indices in the whole batch."""
    idx, cu = split_tokens(x["cu_seqlens"].numpy(), x["cuts"])[rank]
    index = torch.tensor(idx)
    part = {
        k: v[index]
        for k, v in x.items()
        if k in ("logp", "old_logp", "mask", "ref_logp", "is_weights")
    }
    part["advantages"] = x["advantages"]
    part["cu_seqlens"] = torch.tensor(cu, dtype=torch.int64)
    return part, index


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_ranks(worker: Callable[[int, int, str], None], outdir: Path) -> list[Any]:
    """``worker(rank, port, outdir)`` on WORLD processes; what each saved as ``rank<r>.pt``."""
    mp.spawn(worker, args=(free_port(), str(outdir)), nprocs=WORLD, join=True)
    return [torch.load(outdir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
