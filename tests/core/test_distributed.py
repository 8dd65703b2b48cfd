"""``process_group=``: rows split along the token axis across two gloo ranks.

Two processes (``torch.multiprocessing``, world size 2, asserted) each pass their own tokens of
the same rows. Every rank's loss, outputs and metrics must be the unsplit call's, and every
rank's gradient the unsplit gradient at its own tokens (not multiplied by the group size), on
both impls, for packed and padded input, uneven splits, a segment absent from one rank, an empty
segment, and a rank without any token.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gmpo_core import gmpo_loss
from tests._packed import split_tokens

WORLD = 2
DT = torch.float64


def _case(name: str) -> dict[str, Any]:
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


KW: dict[str, Any] = {"epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.05, "dual_clip": 2.0}
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


def _shard(x: dict[str, Any], rank: int) -> tuple[dict[str, Any], torch.Tensor]:
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
            x = _case(case)
            part, index = _shard(x, rank)
            part["cuts"] = None
            for impl in ("plain", "compiled"):
                for which in UPSTREAM:
                    r = _run(part, impl, which, process_group=group)
                    results[f"packed/{case}/{impl}/{which}"] = (r, index)
        x = _case("uneven")
        pad = _padded_shard(x, rank)
        for impl in ("plain", "compiled"):
            r = _run({**pad, "cuts": None}, impl, "per_sequence_loss", process_group=group)
            results[f"padded/{impl}"] = (r, rank)
        torch.save(results, Path(outdir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    outdir = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(_free_port(), str(outdir)), nprocs=WORLD, join=True)
    return [torch.load(outdir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


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
    whole = _run(_case(case), "plain", which)
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
    x = _case("uneven")
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


# check_values=True: the ranks agree before any other collective ---------------------------------

# Each scenario changes rank 1's call (rank 0 keeps the good one); the message every rank must
# raise. Without the agreement step gloo aborted the processes ("Received data size doesn't
# match expected size"), gave each rank another loss, or left rank 0 waiting for the timeout.
DISAGREE: dict[str, tuple[dict[str, Any], str]] = {
    "rows": ({"rows": 3}, r"disagree on rows \(B, or S with cu_seqlens\) \(rank 0: 4, rank 1: 3\)"),
    "dtype": ({"dtype": torch.float32}, r"disagree on logp dtype \(rank 0: torch.float64, rank 1: torch.float32\)"),
    "inputs": ({"is_weights": True}, r"disagree on inputs given"),
    "advantages": ({"advantages": [1.0, -0.5, 0.7, 2.0]}, r"disagree on advantages \(checksum\)"),
    "order": ({"advantages": [-1.5, 1.0, 0.7, 2.0]}, r"disagree on advantages \(weighted checksum\)"),
    "epsilon": ({"epsilon": 0.3}, r"disagree on epsilon \(rank 0: 0.2, rank 1: 0.3\)"),
    "impl": ({"impl": "compiled"}, r"disagree on impl \(rank 0: plain, rank 1: compiled\)"),
    "refused value": ({"nan": True}, r"rank 1's input was refused: advantages must be finite"),
    "refused shape": ({"mask_shape": True}, r"rank 1's input was refused: mask must have the shape"),
}  # fmt: skip


def _agreement_call(rank: int, change: dict[str, Any], group: Any) -> str:
    """One padded call of this rank with ``change`` applied on rank 1; what it raised."""
    g = torch.Generator().manual_seed(11 + rank)  # each rank its own tokens of the rows
    b, t = 4, 3 + rank
    c = change if rank == 1 else {}
    rows, dtype = c.get("rows", b), c.get("dtype", DT)
    logp = -torch.rand(rows, t, generator=g, dtype=dtype)
    adv = torch.tensor(c.get("advantages", [1.0, -1.5, 0.7, 2.0])[:rows], dtype=DT)
    if c.get("nan"):
        adv[0] = float("nan")
    mask = torch.ones(rows, t + (1 if c.get("mask_shape") else 0), dtype=torch.bool)
    weights = torch.rand(rows, generator=g, dtype=DT) + 0.5 if c.get("is_weights") else None
    kw = {"epsilon": c.get("epsilon", 0.2), "impl": c.get("impl", "plain")}
    try:
        out = gmpo_loss(
            logp, logp + 0.1, adv, mask, is_weights=weights, check_values=True,
            process_group=group, **kw,
        )  # fmt: skip
    except ValueError as e:
        return f"ValueError: {e}"
    return f"ok {out.loss.item():.12f}"


def _agreement_worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=300)
    )
    try:
        assert dist.get_world_size() == WORLD
        group = dist.group.WORLD
        results = {"agree": _agreement_call(rank, {}, group)}
        for name, (change, _) in DISAGREE.items():
            results[name] = _agreement_call(rank, change, group)
        results["after"] = _agreement_call(rank, {}, group)  # the group still works
        torch.save(results, Path(outdir) / f"rank{rank}.pt")
        dist.barrier()  # no rank tears the group down while the other still uses it
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def agreement(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    outdir = tmp_path_factory.mktemp("agreement")
    mp.spawn(_agreement_worker, args=(_free_port(), str(outdir)), nprocs=WORLD, join=True)
    return [torch.load(outdir / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("name", list(DISAGREE))
def test_ranks_that_disagree_all_raise_the_same_error(
    agreement: list[dict[str, str]], name: str
) -> None:
    """Defect: ranks that disagreed on B, dtype, given inputs, advantages or hyper-parameters
    got a SIGABRT from gloo or silently different results, and a rank refused before the
    collective left the others waiting. With check_values=True every rank raises one
    ValueError naming what differs, or which rank's input was refused."""
    got = [agreement[r][name] for r in range(WORLD)]
    assert got[0] == got[1], got
    assert got[0].startswith("ValueError: gmpo_loss:"), got[0]
    assert re.search(DISAGREE[name][1], got[0]), got[0]


def test_ranks_that_agree_compute(agreement: list[dict[str, str]]) -> None:
    for key in ("agree", "after"):
        got = [agreement[r][key] for r in range(WORLD)]
        assert got[0] == got[1] and got[0].startswith("ok "), got
