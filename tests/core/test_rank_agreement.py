"""``process_group=`` with ``check_values=True``: the ranks agree before any other collective.

Two processes (``torch.multiprocessing``, world size 2, asserted) make calls that disagree (each
rank raises one ValueError naming what differs), that agree (each computes the same loss), or
that check on some ranks only (those raise; none hangs). And a split call without the check
starts with the fixed-size collective that a checking rank meets.
"""

from __future__ import annotations

import datetime
import math
import numbers
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gmpo_core import gmpo_loss
from tests.core._distributed import DT, KW, WORLD, shard, spawn_ranks, split_case


class BadReal:
    """A number type whose conversion to float fails with another error than ValueError."""

    def __float__(self) -> float:
        raise RuntimeError("no float here")


numbers.Real.register(BadReal)


# Each scenario changes rank 1's call (rank 0 keeps the good one; "both" changes both ranks'
# calls); the message every rank must raise. Without the agreement step gloo aborted the
# processes ("Received data size doesn't match expected size"), gave each rank another loss, or
# left rank 0 waiting for the timeout.
GRPO_ADV = [1.0, -1.0, -1.0, 1.0]  # sums to 0, and so does sum(i * A_i)
LONG = "\u20ac" * 300  # a refusal message past 512 bytes, cut inside a 3-byte character before
DISAGREE: dict[str, tuple[dict[str, Any], str]] = {
    "rows": ({"rows": 3}, r"disagree on rows \(B, or S with cu_seqlens\) \(rank 0: 4, rank 1: 3\)"),
    "dtype": ({"dtype": torch.float32}, r"disagree on logp dtype \(rank 0: torch.float64, rank 1: torch.float32\)"),
    "inputs": ({"is_weights": True}, r"disagree on inputs given"),
    "advantages": ({"advantages": [1.0, -0.5, 0.7, 2.0]}, r"disagree on advantages \(digest"),
    "order": ({"advantages": [-1.5, 1.0, 0.7, 2.0]}, r"disagree on advantages \(digest"),
    # (CHANGELOG, 0.2): the old checksums (sum A, sum i A_i) missed these
    "negated advantages": ({"both": {"advantages": GRPO_ADV}, "advantages": [-a for a in GRPO_ADV]}, r"disagree on advantages \(digest"),
    "rows swapped in pairs": ({"both": {"advantages": [2.0, 0.0, -1.0, 1.0]}, "advantages": [0.0, 2.0, 1.0, -1.0]}, r"disagree on advantages \(digest"),
    # (CHANGELOG, 0.2): row weights were not compared
    "row weights doubled": ({"both": {"row_weights": 1.0}, "row_weights": 2.0}, r"disagree on row is_weights \(digest"),
    "epsilon": ({"epsilon": 0.3}, r"disagree on epsilon \(rank 0: 0.2, rank 1: 0.3\)"),
    "impl": ({"impl": "compiled"}, r"disagree on impl \(rank 0: plain, rank 1: compiled\)"),
    "refused value": ({"nan": True}, r"rank 1's input was refused: advantages must be finite"),
    "refused shape": ({"mask_shape": True}, r"rank 1's input was refused: mask must have the shape"),
    # (CHANGELOG, 0.2): an OverflowError left rank 1 alone; a longdouble became an infinite bound
    "epsilon 10**400": ({"epsilon": 10**400}, r"rank 1's input was refused: epsilon must be a finite number > 0"),
    "epsilon longdouble 1e400": ({"epsilon": np.longdouble("1e400")}, r"rank 1's input was refused: epsilon must be a finite number > 0"),
    # a validation error that is not a ValueError (here a broken number type's) is refused too
    "epsilon whose float() raises": ({"epsilon": BadReal()}, r"rank 1's input was refused: RuntimeError: no float here"),
    # (CHANGELOG, 0.2): the 512-byte cut split a UTF-8 character
    "long non-ASCII message": ({"impl": LONG}, "rank 1's input was refused: impl must be 'plain'.*got '\u20ac+$"),
}  # fmt: skip

# Calls that agree: every rank computes, and gets the same loss.
AGREE: dict[str, dict[str, Any]] = {
    "agree": {},
    # (CHANGELOG, 0.2): the checksum overflowed to NaN, read as a refusal without a reason
    "advantages near 1e308": {"both": {"advantages": [1.7e308, 1.7e308, -1.7e308, -1.7e308]}},
    "row weights": {"both": {"row_weights": 1.0}},
    "-0.0 and 0.0": {
        "both": {"advantages": [1.0, 0.0, -1.0, 2.0]},
        "advantages": [1.0, -0.0, -1.0, 2.0],
    },
    "token weights and KL": {"both": {"tokens": True}},  # per token: each rank its own
}

# (CHANGELOG, 0.2): check_values set on some ranks only hung until the group's timeout (one
# rank in the agreement's all_gather, the other in the forward's all_reduce). The ranks that
# check raise; the others cannot know without a host read, and get a loss that is not finite.
CHECK_DIFFERS: dict[str, tuple[dict[str, Any], int]] = {  # the scenario, the rank that checks
    "rank 0 checks": ({"check_values": False}, 0),
    "rank 1 checks": ({"both": {"check_values": False}, "check_values": True}, 1),
    "rank 0 checks, float32": ({"both": {"dtype": torch.float32}, "check_values": False}, 0),
    "rank 1 checks, token weights and KL": (
        {"both": {"check_values": False, "tokens": True}, "check_values": True}, 1),
}  # fmt: skip
SHORT = datetime.timedelta(seconds=30)  # each scenario's own group: a regression fails, not hangs


def _agreement_call(rank: int, change: dict[str, Any], group: Any) -> str:
    """One padded call of this rank with ``change`` applied on rank 1 (``change["both"]`` on
    both ranks); what it raised, or its loss."""
    g = torch.Generator().manual_seed(11 + rank)  # each rank its own tokens of the rows
    b, t = 4, 3 + rank
    c = {**change.get("both", {}), **(change if rank == 1 else {})}
    rows, dtype = c.get("rows", b), c.get("dtype", DT)
    logp = -torch.rand(rows, t, generator=g, dtype=dtype)
    adv = torch.tensor(c.get("advantages", [1.0, -1.5, 0.7, 2.0])[:rows], dtype=DT)
    if c.get("nan"):
        adv[0] = float("nan")
    mask = torch.ones(rows, t + (1 if c.get("mask_shape") else 0), dtype=torch.bool)
    weights = torch.rand(rows, generator=g, dtype=DT) + 0.5 if c.get("is_weights") else None
    if "row_weights" in c:  # the same on every rank, times the scenario's factor
        weights = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=DT)[:rows] * c["row_weights"]
    kw: dict[str, Any] = {"epsilon": c.get("epsilon", 0.2), "impl": c.get("impl", "plain")}
    if c.get("tokens"):  # token weights and the KL term: this rank's own tokens
        weights = torch.rand(rows, t, generator=g, dtype=dtype) + 0.5
        kw.update(beta=0.05, ref_logp=logp - 0.2 * torch.rand(rows, t, generator=g, dtype=dtype))
    try:
        out = gmpo_loss(
            logp, logp + 0.1, adv, mask, is_weights=weights,
            check_values=c.get("check_values", True), process_group=group, **kw,
        )  # fmt: skip
    except Exception as e:  # any other exception than the ValueError is a failure
        return f"{type(e).__name__}: {e}"
    return f"ok {out.loss.item():.12f}"


def _agreement_worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=300)
    )
    try:
        assert dist.get_world_size() == WORLD
        results: dict[str, str] = {}
        scenarios = {**{k: v[0] for k, v in DISAGREE.items()}, **AGREE}
        scenarios.update({k: v[0] for k, v in CHECK_DIFFERS.items()})
        for name, change in scenarios.items():
            # a group of its own with a short timeout: a scenario that hangs (or leaves the
            # ranks out of step) times out alone instead of taking the others with it
            group = dist.new_group(list(range(WORLD)), timeout=SHORT)
            results[name] = _agreement_call(rank, change, group)
            results[f"{name}/after"] = _agreement_call(rank, {}, group)  # the group still works
        torch.save(results, Path(outdir) / f"rank{rank}.pt")
        dist.barrier()  # no rank tears the group down while the other still uses it
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def agreement(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    return spawn_ranks(_agreement_worker, tmp_path_factory.mktemp("agreement"))


@pytest.mark.parametrize("name", list(DISAGREE))
def test_ranks_that_disagree_all_raise_the_same_error(
    agreement: list[dict[str, str]], name: str
) -> None:
    """Defect: ranks that disagreed on B, dtype, given inputs, advantages, row weights or
    hyper-parameters got a SIGABRT from gloo or silently different results, and a rank refused
    before the collective left the others waiting. With check_values=True every rank raises one
    ValueError naming what differs, or which rank's input was refused (and why, its message
    cut on a character boundary)."""
    got = [agreement[r][name] for r in range(WORLD)]
    assert got[0] == got[1], got
    assert got[0].startswith("ValueError: gmpo_loss:"), got[0]
    assert re.search(DISAGREE[name][1], got[0]), got[0]
    assert "\ufffd" not in got[0], got[0]
    _assert_the_group_still_works(agreement, name)


@pytest.mark.parametrize("name", list(AGREE))
def test_ranks_that_agree_compute(agreement: list[dict[str, str]], name: str) -> None:
    got = [agreement[r][name] for r in range(WORLD)]
    assert got[0] == got[1] and got[0].startswith("ok "), got
    _assert_the_group_still_works(agreement, name)


@pytest.mark.parametrize("name", list(CHECK_DIFFERS))
def test_check_values_on_some_ranks_only_raises_there_and_never_hangs(
    agreement: list[dict[str, str]], name: str
) -> None:
    checks = CHECK_DIFFERS[name][1]
    got = [agreement[r][name] for r in range(WORLD)]
    assert re.fullmatch(
        r"ValueError: gmpo_loss: check_values=True on this rank but not on every rank of "
        r"process_group: .*",
        got[checks],
    ), got
    other = got[1 - checks]
    assert other.startswith("ok ") and not math.isfinite(float(other[3:])), got
    _assert_the_group_still_works(agreement, name)


def _assert_the_group_still_works(agreement: list[dict[str, str]], name: str) -> None:
    after = [agreement[r][f"{name}/after"] for r in range(WORLD)]
    assert after[0] == after[1] and after[0].startswith("ok "), after


def test_a_split_call_without_check_values_starts_with_the_fixed_size_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S15/S16: a split forward's first collective is the fixed-size all-reduce (MIN, five
    float64) that a rank in the agreement step meets, and its payload is made on the device:
    the call runs end to end on the meta device, where a host read raises."""
    calls: list[tuple[tuple[int, ...], torch.dtype, Any]] = []

    def record(t: torch.Tensor, op: Any = None, group: Any = None) -> None:
        calls.append((tuple(t.shape), t.dtype, op))

    monkeypatch.setattr(dist, "all_reduce", record)
    part, _ = shard(split_case("uneven"), 0)
    meta = {k: v.to("meta") for k, v in part.items()}
    logp = meta.pop("logp").requires_grad_()
    out = gmpo_loss(logp, **meta, **KW, process_group=object())
    out.loss.backward()
    assert out.loss.device.type == "meta" and logp.grad is not None
    assert calls[0] == ((5,), torch.float64, dist.ReduceOp.MIN), calls
    assert [c[2] for c in calls[1:]] == [dist.ReduceOp.SUM], calls
