"""Rows of tokens and their sums: the layer under :mod:`gmpo_core._math` and
:mod:`gmpo_core._counts`.

A row is either a padded row of a (B, T) batch or a *segment* of packed (N,) tokens, given by
``cu_seqlens`` (flash-attention's convention). Every per-row reduction goes through
:func:`row_sum` and every per-row value reaches the tokens through :func:`to_tokens`, so both
layouts run the same formulas.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd import forward_ad


class Segments(NamedTuple):
    """Packed rows. Shape: offsets (S + 1,) int64, within [0, N] and non-decreasing; ids (N,)
    int64, the row of each token."""

    offsets: Tensor
    ids: Tensor


def rows(values: Tensor) -> Tensor:
    """Per-row values (B,) as a (B, 1) column that broadcasts against (B, T)."""
    return values.unsqueeze(-1)


def segments(cu_seqlens: Tensor, n_tokens: int) -> Segments:
    """The rows of packed tokens, without a device sync: offsets clamped into [0, N] and made
    non-decreasing (so that no values of ``cu_seqlens`` can make a kernel read out of bounds;
    :func:`gmpo_core._checks.check_cu_seqlens_values` rejects such values on request), and each
    token's row, ``#{i >= 1: offsets[i] <= t}``, as a cumulative count of row starts."""
    offsets = torch.cummax(cu_seqlens.to(torch.int64).clamp(0, n_tokens), 0).values
    # The ends of rows 0..S-1 are the starts of rows 1..S (N for the last and trailing empty
    # rows); row S does not exist, so the count stops at S - 1. Not ``offsets[1:-1]``: compiled
    # code would specialize its size S - 1 at 1 (a recompilation between S = 2 and S = 3).
    ends = offsets[1:]
    starts = offsets.new_zeros(n_tokens + 1).index_add_(0, ends, torch.ones_like(ends))
    return Segments(offsets, starts[:n_tokens].cumsum(0).clamp(max=offsets.shape[0] - 2))


def row_sum(x: Tensor, seg: Segments | None, exact: bool = False) -> Tensor:
    """Per-row sums: over the last axis of padded rows (ATen's pairwise sum), over each segment
    of packed ones accumulated in float64 (a segment's sum is sequential: in float32 it would
    lose digits with the segment's length). In ``x``'s dtype; with ``exact`` (counts: ``x``
    holds integers), float64 wherever ``x``'s dtype could not hold every integer of the sum
    (float32 counts to 2^24). Padded sums in compiled CPU code: see :func:`unguarded`.
    Packed sums of a tensor that may be differentiated (:func:`differentiated`) are an
    ``index_add`` over each token's row, which has a double backward and a forward derivative;
    the others (the forward inside the paths' ``autograd.Function``, counts) a
    ``torch.segment_reduce``, which has neither but is ~3x faster on CPU (0.18 against 0.59 ms
    for 164k tokens, torch 2.13). Both sum each segment in token order on CPU, so they agree to
    the bit there. Shape: (B, T) -> (B,), or (N,) -> (S,)."""
    if seg is None:
        wide = exact and x.dtype != torch.float64 and x.shape[-1] > _EXACT_FLOAT32
        if exact and unguarded(x):  # counts in int32: exact to 2^31, about as fast as float32
            counts = x.to(torch.int32).sum(-1, dtype=torch.int32)
            return counts.to(torch.float64 if wide else x.dtype)
        if wide:
            return x.sum(-1, dtype=torch.float64)
        return wide_sum(x, -1)
    x64 = x.to(torch.float64)
    if differentiated(x):
        sums = x64.new_zeros(seg.offsets.shape[0] - 1).index_add(0, seg.ids, x64)
    else:
        sums = torch.segment_reduce(x64, "sum", offsets=seg.offsets, unsafe=True)
    return sums if exact else sums.to(x.dtype)


def wide_sum(x: Tensor, dim: int | None = None) -> Tensor:
    """``x.sum(dim)`` (all of ``x`` when ``dim`` is None) in ``x``'s dtype; accumulated in
    float64 where :func:`unguarded`. Shape: (..., T) -> (...), or () with ``dim`` None."""
    if unguarded(x):
        wide = x.sum(dtype=torch.float64) if dim is None else x.sum(dim, dtype=torch.float64)
        return wide.to(x.dtype)
    return x.sum() if dim is None else x.sum(dim)


def unguarded(x: Tensor) -> bool:
    """Whether a sum of ``x`` is traced for Inductor's CPU code in float32 (or lower): there it
    is taken in another dtype (float64 values, int32 counts). Inductor's CPU code for a float32
    sum chooses between two loops by whether it runs over more than 4096 elements, and guards
    that choice on the sizes of the first call: a later call on the other side of 4096 (a
    (3, 5) batch, then (3, 4100) or (5000, 3)) would compile again. Other dtypes have one loop.
    Eager code, float64 and other devices sum as ATen does."""
    return (
        torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and x.is_floating_point()
        and x.dtype != torch.float64
    )


def differentiated(x: Tensor) -> bool:
    """Whether a derivative of ``x`` may be taken: it records autograd history (a
    ``torch.func.grad`` input too), or carries a forward-mode tangent (a dual tensor of
    ``torch.autograd.forward_ad`` or of ``torch.func.jvp``, which ``unpack_dual`` both see).
    Traced code is not run in forward mode: there the history decides."""
    if x.requires_grad:
        return True
    return not torch.compiler.is_compiling() and has_tangent(x)


def constant(x: Tensor) -> Tensor:
    """``x`` detached where it records history (a ``detach`` is a call of its own, which counts on
    small batches: the paths' forward runs without history)."""
    return x.detach() if x.requires_grad else x


def has_tangent(x: Tensor) -> bool:
    """Whether ``x`` carries a forward-mode tangent at the current level (False outside one)."""
    return forward_ad.unpack_dual(x).tangent is not None  # type: ignore[no-untyped-call]


_EXACT_FLOAT32 = 2**24  # float32 holds every integer up to here


def to_tokens(values: Tensor, seg: Segments | None) -> Tensor:
    """Per-row values where they broadcast against the tokens. Shape: (B,) -> (B, 1), or
    (S,) -> (N,)."""
    return rows(values) if seg is None else values.index_select(0, seg.ids)
