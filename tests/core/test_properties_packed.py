"""Property tests of gmpo_loss on packed sequences (``cu_seqlens``) and on rows split across
ranks (``process_group``, here threads in one process): each equals the padded, whole call and
the independent float64 reference (docs/semantics.md).

Every property runs on both paths (``impl`` fixture: "plain" and "compiled").
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st

from gmpo_core import gmpo_loss
from tests._helpers import (
    assert_close,
    to_torch,
    well_conditioned,
)
from tests._packed import packed_to_torch, ref_packed, run_packed, split_tokens
from tests.core._properties import assert_metrics_match, loss_scale
from tests.strategies import Batch, PackedBatch, garbage, pack, packed_batches

# ---------------------------------------------------------------------------------------------
# Packed sequences (cu_seqlens): the padded call's result on the same rows
# ---------------------------------------------------------------------------------------------


@given(packed_batches())
@example(  # empty segments first, in the middle and last; a hole; a row weight
    pack(
        Batch(
            logp=np.array([[-1.0, -2.0], [-0.5, -1.0], [-2.0, -0.1], [-1.0, -1.0]], np.float32),
            old_logp=np.array([[-1.5, -1.0], [-0.5, -3.5], [-1.0, -1.0], [-1.0, -1.0]], np.float32),
            advantages=np.array([1.0, -1.0, 0.5, -2.0], np.float32),
            mask=np.array([[1, 1], [1, 0], [1, 1], [1, 1]], bool),
            kwargs={"epsilon": 0.4, "is_weights": np.array([0.5, 1.0, 2.0, 1.5], np.float32)},
        ),
        np.array([0, 2, 0, 1]),
    )
)
def test_packed_matches_reference(impl: str, batch: PackedBatch) -> None:
    """Values, gradient and metrics of a packed call equal the float64 reference's on the same
    rows, for any segment lengths (empty segments are empty rows)."""
    assume(well_conditioned(batch.padded))
    out, grad = run_packed(batch, impl)
    exp = ref_packed(batch)
    scale = loss_scale(exp.per_sequence_loss)
    assert out.per_sequence_loss.shape == out.log_coef.shape == batch.advantages.shape
    assert grad.shape == batch.logp.shape
    assert_close(out.per_sequence_loss, exp.per_sequence_loss, torch.float32, "value", scale)
    assert_close(out.loss, exp.loss, torch.float32, "value", scale)
    assert_close(out.log_coef, exp.log_coef, torch.float32, "value", 10.0)
    assert_close(grad, exp.grad_logp, torch.float32, "grad", scale)
    assert_metrics_match(out, exp, batch.padded)


@given(packed_batches(), st.data())
def test_packed_equals_padded(impl: str, batch: PackedBatch, data: st.DataObject) -> None:
    """packed == padded on the same rows: loss, per_sequence_loss, log_coef, the gradient of a
    random combination of all three, and every metric (float32 sums in another order). The
    padded call runs on the plain path (the compiled one equals it, tested above)."""
    padded = to_torch(batch.padded)
    packed = packed_to_torch(batch)
    s = len(batch.advantages)
    g = [torch.tensor(data.draw(st.lists(st.floats(-2, 2, width=32, allow_subnormal=False), min_size=n, max_size=n)),
                      dtype=torch.float32).reshape(shape)
         for n, shape in ((1, ()), (s, (s,)), (s, (s,)))]  # fmt: skip
    results = []
    for args, path in ((padded, "plain"), (packed, impl)):
        out = gmpo_loss(**args, impl=path)
        (grad,) = torch.autograd.grad((out.loss, out.per_sequence_loss, out.log_coef),
                                      args["logp"], g)  # fmt: skip
        results.append((out, grad))
    (pad_out, pad_grad), (pk_out, pk_grad) = results
    scale = float(max(1.0, pad_out.per_sequence_loss.abs().max().item()))
    assert_close(pk_out.loss, pad_out.loss, torch.float32, "value", scale)
    assert_close(pk_out.per_sequence_loss, pad_out.per_sequence_loss, torch.float32, "value", scale)
    assert_close(pk_out.log_coef, pad_out.log_coef, torch.float32, "value", 10.0)
    keep = np.arange(batch.padded.shape[1])[None, :] < np.diff(batch.cu_seqlens)[:, None]
    assert_close(pk_grad, pad_grad[torch.tensor(keep)], torch.float32, "grad", 4 * scale * s)
    assert pk_out.metrics.keys() == pad_out.metrics.keys()
    for k, v in pad_out.metrics.items():
        torch.testing.assert_close(
            pk_out.metrics[k], v, rtol=1e-5, atol=1e-6, equal_nan=True, msg=k
        )
    for field in ("num_tokens", "num_clipped_low", "num_clipped_high", "num_clipped_dual"):
        assert getattr(pk_out.stats, field) == getattr(pad_out.stats, field), field


@given(packed_batches(), garbage())
def test_packed_ignores_masked_tokens(impl: str, batch: PackedBatch, junk: float) -> None:
    """NaN, inf or huge values at masked packed tokens change nothing; their gradient is 0."""
    dirty = np.where(batch.mask, batch.logp, np.float32(junk)).astype(np.float32)
    old = np.where(batch.mask, batch.old_logp, np.float32(-junk)).astype(np.float32)
    out, grad = run_packed(batch, impl)
    out_d, grad_d = run_packed(PackedBatch(dirty, old, batch.advantages, batch.mask,
                                           batch.cu_seqlens, batch.kwargs, batch.padded), impl)  # fmt: skip
    assert torch.equal(out_d.per_sequence_loss, out.per_sequence_loss)
    assert torch.equal(grad_d, grad)
    assert torch.equal(grad_d[torch.tensor(~batch.mask)], torch.zeros(int((~batch.mask).sum())))


# ---------------------------------------------------------------------------------------------
# Rows split across ranks (process_group): every rank gets the whole rows' values
# ---------------------------------------------------------------------------------------------


class _ThreadGroup:
    """A stand-in process group for ranks that are threads of this process: ``all_reduce``
    (patched in below) exchanges the tensors through shared slots. The real collectives are
    tested with two gloo processes in tests/core/test_distributed.py."""

    def __init__(self, ranks: int) -> None:
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * ranks


def _thread_all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None) -> None:
    shared, rank = group
    shared.slots[rank] = tensor.clone()
    shared.barrier.wait()
    stacked = torch.stack(shared.slots)
    reduce = {torch.distributed.ReduceOp.SUM: torch.sum, torch.distributed.ReduceOp.MIN: torch.amin}
    result = reduce[op](stacked, 0)
    shared.barrier.wait()  # every rank has read the slots before any writes the next ones
    tensor.copy_(result)


@given(packed_batches(), st.integers(2, 3), st.data())
def test_split_across_ranks_equals_whole(
    batch: PackedBatch, ranks: int, data: st.DataObject
) -> None:
    """Each segment's tokens cut into ``ranks`` contiguous parts at drawn points (parts may be
    empty: a segment absent from a rank): every rank's loss, outputs and metrics are the whole
    call's, and its gradient the whole call's at its own tokens."""
    lengths = np.diff(batch.cu_seqlens)
    cuts = np.array([sorted(data.draw(st.lists(st.integers(0, int(n)), min_size=ranks - 1,
                                               max_size=ranks - 1))) for n in lengths],
                    np.int64).reshape(len(lengths), ranks - 1)  # fmt: skip
    whole_args = packed_to_torch(batch)
    whole = gmpo_loss(**whole_args)
    (whole_grad,) = torch.autograd.grad(whole.loss, whole_args["logp"])
    shared = _ThreadGroup(ranks)
    results: list[Any] = [None] * ranks

    def rank_call(rank: int, idx: np.ndarray, cu: np.ndarray) -> None:
        try:
            args = packed_to_torch(batch)
            index = torch.tensor(idx)
            for key in ("logp", "old_logp", "mask", "ref_logp", "is_weights"):
                if key in args and args[key].shape == whole_args["logp"].shape:
                    args[key] = args[key].detach()[index]
            args["logp"].requires_grad_()
            args["cu_seqlens"] = torch.tensor(cu)
            out = gmpo_loss(**args, process_group=(shared, rank))
            (grad,) = torch.autograd.grad(out.loss, args["logp"])
            results[rank] = (out, grad, index)
        except BaseException as e:  # reported below
            shared.barrier.abort()
            results[rank] = e

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.distributed, "all_reduce", _thread_all_reduce)
        threads = [threading.Thread(target=rank_call, args=(k, *part))
                   for k, part in enumerate(split_tokens(batch.cu_seqlens, cuts))]  # fmt: skip
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    scale = float(max(1.0, whole.per_sequence_loss.abs().max().item()))
    for res in results:
        assert not isinstance(res, BaseException), res
        out, grad, index = res
        assert_close(out.loss, whole.loss, torch.float32, "value", scale)
        assert_close(out.per_sequence_loss, whole.per_sequence_loss, torch.float32, "value", scale)
        assert_close(out.log_coef, whole.log_coef, torch.float32, "value", 10.0)
        assert_close(grad, whole_grad[index], torch.float32, "grad", scale)
        assert out.metrics.keys() == whole.metrics.keys()
        for k, v in whole.metrics.items():
            torch.testing.assert_close(
                out.metrics[k], v, rtol=1e-5, atol=1e-6, equal_nan=True, msg=k
            )
        assert out.stats.num_tokens == whole.stats.num_tokens
        assert out.stats.num_clipped_low == whole.stats.num_clipped_low
        assert out.stats.num_clipped_high == whole.stats.num_clipped_high
