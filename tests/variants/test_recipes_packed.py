"""The segment recipes of docs/recipes.md ("Segments"), executed from the page: turns as
segments averaged per turn or per trajectory, against the float64 reference; segments from
``position_ids`` resets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from tests._helpers import assert_close, well_conditioned
from tests._packed import packed_to_torch, ref_packed
from tests.strategies import PackedBatch, garbage, packed_batches

PAGE = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
BLOCK = re.compile(r"^```py\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _load() -> dict[str, Any]:
    text = PAGE.read_text(encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": "segment_recipes"}
    blocks = list(BLOCK.finditer(text))
    assert blocks, "no py blocks on the page"
    for match in blocks:
        first_line = text.count("\n", 0, match.start(1))
        exec(compile("\n" * first_line + match.group(1), str(PAGE), "exec"), namespace)
    return namespace


NS = _load()
multi_turn_loss = NS["multi_turn_loss"]
segments_from_starts = NS["segments_from_starts"]


@st.composite
def trajectories(draw: st.DrawFn) -> tuple[PackedBatch, np.ndarray]:
    """Packed turns (segments, tool tokens masked) and how many turns each trajectory has."""
    batch = draw(packed_batches())
    s = len(batch.advantages)
    cuts = sorted(draw(st.sets(st.integers(1, s - 1), max_size=s - 1))) if s > 1 else []
    counts = np.diff(np.array([0, *cuts, s]))
    return batch, counts


def _kwargs(batch: PackedBatch) -> dict[str, Any]:
    args = packed_to_torch(batch)
    args["turn_advantages"] = args.pop("advantages")
    args["cu_turns"] = args.pop("cu_seqlens")
    return args


@given(trajectories())
def test_per_turn_average_is_the_packed_loss(data: tuple[PackedBatch, np.ndarray]) -> None:
    batch, counts = data
    assume(well_conditioned(batch.padded))
    args = _kwargs(batch)
    loss = multi_turn_loss(**args, turns_per_trajectory=torch.tensor(counts), average="turn")
    (grad,) = torch.autograd.grad(loss, args["logp"])
    exp = ref_packed(batch)
    scale = float(max(1.0, np.abs(exp.per_sequence_loss).max(initial=0.0)))
    assert_close(loss, exp.loss, torch.float32, "value", scale)
    assert_close(grad, exp.grad_logp, torch.float32, "grad", scale)


@given(trajectories())
def test_per_trajectory_average(data: tuple[PackedBatch, np.ndarray]) -> None:
    """The mean over trajectories of the mean over their turns of the reference's per-turn
    losses; each turn's gradient is its reference gradient reweighted accordingly."""
    batch, counts = data
    assume(well_conditioned(batch.padded))
    args = _kwargs(batch)
    loss = multi_turn_loss(**args, turns_per_trajectory=torch.tensor(counts))
    (grad,) = torch.autograd.grad(loss, args["logp"])
    exp = ref_packed(batch)
    s, r = len(batch.advantages), len(counts)
    trajectory = np.repeat(np.arange(r), counts)  # (S,)
    weight = 1.0 / (r * counts[trajectory])  # (S,) d loss / d per_sequence_loss_i
    expected = float((weight * exp.per_sequence_loss).sum())
    # the reference's gradient is that of the mean over turns: S * it is d ps_i / d logp
    turn_of_token = np.repeat(np.arange(s), np.diff(batch.cu_seqlens))
    expected_grad = exp.grad_logp * s * weight[turn_of_token]
    scale = float(max(1.0, np.abs(exp.per_sequence_loss).max(initial=0.0)))
    assert_close(loss, expected, torch.float32, "value", scale)
    assert_close(grad, expected_grad, torch.float32, "grad", scale * s)


@given(trajectories(), garbage())
def test_tool_tokens_never_matter(data: tuple[PackedBatch, np.ndarray], junk: float) -> None:
    batch, counts = data
    args = _kwargs(batch)
    loss = multi_turn_loss(**args, turns_per_trajectory=torch.tensor(counts))
    tool = ~torch.tensor(batch.mask)
    dirty = {**args, "logp": args["logp"].detach().masked_fill(tool, junk).requires_grad_()}
    dirty["old_logp"] = args["old_logp"].masked_fill(tool, -junk)
    loss_d = multi_turn_loss(**dirty, turns_per_trajectory=torch.tensor(counts))
    (grad,) = torch.autograd.grad(loss_d, dirty["logp"])
    assert torch.equal(loss_d, loss)
    assert torch.equal(grad[tool], torch.zeros(int(tool.sum())))


@given(st.lists(st.integers(0, 6), min_size=1, max_size=8))
def test_segments_from_position_id_resets(lengths: list[int]) -> None:
    """Sequences of these lengths packed with position_ids 0, 1, ... each (empty ones vanish:
    they have no token to restart at)."""
    nonempty = [n for n in lengths if n > 0]
    assume(nonempty)
    position_ids = torch.cat([torch.arange(n) for n in nonempty])
    cu = segments_from_starts(position_ids == 0)
    assert cu.tolist() == np.concatenate([[0], np.cumsum(nonempty)]).tolist()
    assert cu.dtype == torch.int64
