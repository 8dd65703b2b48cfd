"""``process_group=``: rows split along the token axis across two gloo ranks.

Two processes (``torch.multiprocessing``, world size 2, asserted) each pass their own tokens of
the same rows. Every rank's loss, outputs and metrics must be the unsplit call's, and every
rank's gradient the unsplit gradient at its own tokens (not multiplied by the group size), on
both impls, for packed and padded input, uneven splits, a segment absent from one rank, an empty
segment, and a rank without any token.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from gmpo_core import gmpo_loss
from tests.core._distributed import DT, KW, WORLD, shard, spawn_ranks, split_case

CASES = ["uneven", "no tokens on rank 1"]
UPSTREAM = ["loss", "per_sequence_loss", "log_coef"]  # the last recomputes under autograd


def _objective(out: Any, which: str) -> torch.Tensor:
    s = out.per_sequence_loss.shape[0]
    up = torch.linspace(-1.0, 2.0, s, dtype=DT)
    if which == "loss":
        return out.loss * 1.0  # type: ignore[no-any-return]
    if which == "per_sequence_loss":
        return (out.per_sequence_loss * up).sum()  # type: ignore[no-any-return]
    return out.loss + (out.log_coef * up).sum()  # type: ignore[no-any-return]


def _run(x: dict[str, Any], impl: str, which: str, **extra: Any) -> dict[str, Any]:
    logp = x["logp"].clone().requires_grad_()
    args = {k: v for k, v in x.items() if k not in ("logp", "cuts")}
    out = gmpo_loss(logp, **args, **KW, impl=impl, **extra)  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(_objective(out, which), logp)
    return {
        "loss": out.loss.detach(),
        "per_sequence_loss": out.per_sequence_loss.detach(),
        "log_coef": out.log_coef.detach(),
        "metrics": {k: v.detach() for k, v in out.metrics.items()},
        "stats": [None if v is None else v.detach() for v in out.stats],
        "grad": grad,
    }


def _padded_shard(x: dict[str, Any], rank: int) -> dict[str, Any]:
    """The same rows padded to (S, T), split at column 3 (uneven)."""
    lengths = x["cu_seqlens"].diff().long()
    t = int(lengths.max())
    keep = torch.arange(t)[None, :] < lengths[:, None]
    out: dict[str, Any] = {"advantages": x["advantages"]}
    for k in ("logp", "old_logp", "mask", "ref_logp", "is_weights"):
        full = torch.zeros(keep.shape, dtype=x[k].dtype)
        full[keep] = x[k]
        out[k] = full[:, :3] if rank == 0 else full[:, 3:]
    out["mask"] = out["mask"] & (keep[:, :3] if rank == 0 else keep[:, 3:])
    return out


def _worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        assert dist.get_world_size() == WORLD
        group = dist.new_group(list(range(WORLD)))
        results: dict[str, Any] = {}
        for case in CASES:
            x = split_case(case)
            part, index = shard(x, rank)
            part["cuts"] = None
            for impl in ("plain", "compiled"):
                for which in UPSTREAM:
                    r = _run(part, impl, which, process_group=group)
                    results[f"packed/{case}/{impl}/{which}"] = (r, index)
        x = split_case("uneven")
        pad = _padded_shard(x, rank)
        for impl in ("plain", "compiled"):
            r = _run({**pad, "cuts": None}, impl, "per_sequence_loss", process_group=group)
            results[f"padded/{impl}"] = (r, rank)
        torch.save(results, Path(outdir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn_ranks(_worker, tmp_path_factory.mktemp("ranks"))


def _assert_same_outputs(got: dict[str, Any], whole: dict[str, Any]) -> None:
    for key in ("loss", "per_sequence_loss", "log_coef"):
        torch.testing.assert_close(got[key], whole[key], rtol=1e-12, atol=1e-13, msg=key)
    assert got["metrics"].keys() == whole["metrics"].keys()
    for key, value in whole["metrics"].items():
        torch.testing.assert_close(
            got["metrics"][key], value, rtol=1e-12, atol=1e-13, equal_nan=True
        )
    for a, b in zip(got["stats"], whole["stats"], strict=True):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=0.0, equal_nan=True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("impl", ["plain", "compiled"])
@pytest.mark.parametrize("which", UPSTREAM)
def test_split_packed_rows_equal_the_whole(
    ranks: list[dict[str, Any]], case: str, impl: str, which: str
) -> None:
    whole = _run(split_case(case), "plain", which)
    grads = torch.zeros_like(whole["grad"])
    covered = torch.zeros(grads.shape[0], dtype=torch.int64)
    for rank in range(WORLD):
        got, index = ranks[rank][f"packed/{case}/{impl}/{which}"]
        _assert_same_outputs(got, whole)
        # the unsplit gradient at this rank's tokens, not multiplied by the group size
        torch.testing.assert_close(got["grad"], whole["grad"][index], rtol=1e-12, atol=1e-15)
        grads[index] += got["grad"]
        covered[index] += 1
    assert torch.equal(covered, torch.ones_like(covered))  # every token on exactly one rank
    torch.testing.assert_close(grads, whole["grad"], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("impl", ["plain", "compiled"])
def test_split_padded_rows_equal_the_whole(ranks: list[dict[str, Any]], impl: str) -> None:
    x = split_case("uneven")
    lengths = x["cu_seqlens"].diff().long()
    keep = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
    full: dict[str, Any] = {"advantages": x["advantages"], "cuts": None}
    for k in ("logp", "old_logp", "mask", "ref_logp", "is_weights"):
        t = torch.zeros(keep.shape, dtype=x[k].dtype)
        t[keep] = x[k]
        full[k] = t
    full["mask"] = full["mask"] & keep
    whole = _run(full, "plain", "per_sequence_loss")
    for rank in range(WORLD):
        got, _ = ranks[rank][f"padded/{impl}"]
        _assert_same_outputs(got, whole)
        cols = slice(0, 3) if rank == 0 else slice(3, None)
        torch.testing.assert_close(got["grad"], whole["grad"][:, cols], rtol=1e-12, atol=1e-15)
