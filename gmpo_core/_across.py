"""Rows split along the token axis across the ranks of a process group: the per-row sums and the
token range of :func:`gmpo_core._math.forward`, reduced over every rank (S15).

Every per-row sum of a split forward goes through :func:`all_rows` before the exponential, so
every rank computes the whole rows' values and the gradient at its own tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor


class Totals(NamedTuple):
    """Per-row sums and token extrema over every rank of a process group.

    Shape:
        sums: (k, B) float, the rows of :func:`forward`'s partial sums. minima: (2,) float,
        ``[min r, -max r]`` (with ±the dtype's largest float where a rank had no valid token).
    """

    sums: Tensor
    minima: Tensor


class Across(NamedTuple):
    """Rows split along the token axis across the ranks of ``group``: every rank holds its own
    tokens of the same rows. ``totals``: the reduced sums of an earlier forward on the same
    inputs (then no collective runs); None: all-reduce them over ``group``."""

    group: Any  # a torch.distributed ProcessGroup (None: the default group)
    totals: Totals | None = None


def all_rows(
    parts: list[Tensor], lo: Tensor, neg_hi: Tensor, across: Across
) -> tuple[list[Tensor], Tensor, Tensor, Totals]:
    """The per-row sums ``parts`` and the token range ``lo``, ``neg_hi`` (min r, -max r) over
    every rank of
    ``across.group`` (or ``across.totals``): first the range with MIN (:func:`first_collective`),
    then the sums with SUM. Each reduced sum keeps the local sum's gradient (the other ranks'
    tokens are constants here), so a rank's gradient is the whole rows' gradient at its own
    tokens. Shape: parts (B,) each."""
    totals = across.totals
    if totals is None:
        sums = torch.stack([p.detach() for p in parts])  # (k, B)
        first = first_collective(lo, neg_hi, sums)
        dist.all_reduce(first, op=dist.ReduceOp.MIN, group=across.group)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=across.group)
        totals = Totals(sums, first[:2].to(lo.dtype))
    reduced = [through(p, t) for p, t in zip(parts, totals.sums.unbind(), strict=True)]
    return reduced, totals.minima[0], totals.minima[1], totals


#: The dtypes the sums of :func:`all_rows` can have, by their code in :func:`first_collective`.
SUMS_DTYPES = (torch.float32, torch.float64)


def first_collective(lo: Tensor, neg_hi: Tensor, sums: Tensor) -> Tensor:
    """The payload of a split forward's first collective, an all-reduce with MIN: the same
    size and dtype whatever the call, so that a rank in the agreement step (``check_values``,
    :mod:`gmpo_core._agree`), whose first collective has this form too, meets it instead of
    hanging: ``[min r, -max r, 0, -sums.numel(), -(code of sums.dtype)]``, float64 (exact for
    ``lo``, ``neg_hi`` and the counts). A 0 in slot 2 tells an agreeing rank that a rank is in its
    forward, and slots 3 and 4 the all-reduce with SUM it runs next. Shape: (5,)."""
    lo64 = lo.to(torch.float64)
    numel = torch.ones_like(sums, dtype=torch.float64).sum()  # no host value: dynamic sizes
    code = lo64.new_full((), -float(SUMS_DTYPES.index(sums.dtype)))
    return torch.stack([lo64, neg_hi.to(torch.float64), torch.zeros_like(lo64), -numel, code])


def through(local: Tensor, total: Tensor) -> Tensor:
    """``total``'s value with ``local``'s gradient (an identity: d total / d local = 1)."""
    if not local.requires_grad:
        return total
    return torch.where(local.isfinite(), total + (local - local.detach()), total)
