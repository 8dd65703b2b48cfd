"""Counts and extrema over valid tokens (S10): where the trust region cut (:class:`Cuts`), and
the :class:`~gmpo_core.metrics.ClipStats` of a forward, from :func:`gmpo_core._math.forward`'s
per-row sums."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from gmpo_core.metrics import ClipStats


class Cuts(NamedTuple):
    """Where the trust region cut, with s = -1 where the clamp cut q at eps, +1 at the dual cap,
    0 elsewhere (invalid tokens too): ``|s|`` per token, per row ``sum |s|`` and ``sum s``, and
    the range of the log-ratio over valid tokens (:func:`log_ratio_range`).

    Shape: cut (B, T) or (N,); cut_rows, signed_rows (B,); lo, hi ().
    """

    cut: Tensor
    cut_rows: Tensor
    signed_rows: Tensor
    lo: Tensor
    hi: Tensor


def log_ratio_range(r: Tensor, mf: Tensor) -> tuple[Tensor, Tensor]:
    """Min and max of ``r`` over valid tokens (``mf``: 0/1), ``+big`` and ``-big`` (the dtype's
    largest float) where there is none (:func:`clip_stats` turns them into ±inf).
    Shape: (B, T) or (N,) -> (), ()."""
    # invalid tokens are pushed out of reach by the largest float
    big = torch.finfo(r.dtype).max
    far = torch.rsub(mf, big, alpha=big)  # big - big mf: 0 at valid tokens, one pass
    return extreme(r + far, "min"), extreme(r - far, "max")


def clip_stats(c: Cuts, adv: Tensor, n: Tensor, dual: bool = True) -> ClipStats:
    """Counts and extrema over valid tokens (S10), from where the trust region cut (``c``: the
    range of the log-ratio over valid tokens, and per row the number of tokens cut, ``sum |s|``,
    and ``sum s``) and the row's valid tokens ``n``. Without ``dual`` (no dual clip),
    ``num_clipped_dual`` is None: built so, not replaced afterwards (torch 2.4's ``torch.compile``
    cannot trace ``NamedTuple._replace``).

    The per-row values go through each reduction stacked, one tensor op for all of them: on a
    small batch every op costs its dispatch, whatever its size (docs/benchmarks.md).

    Shape: c.lo, c.hi (); c.cut_rows, c.signed_rows, adv, n (B,).
    """
    at_eps = (c.cut_rows - c.signed_rows) / 2  # (B,)
    low = torch.where(adv < 0, at_eps, 0)
    high = torch.where(adv > 0, at_eps, 0)
    counts = [n, low, high]
    if dual:
        counts.append((c.cut_rows + c.signed_rows) / 2)  # (B,) at the cap: A < 0 rows only
    totals = total(torch.stack(counts)).unbind()  # exact int64 each
    # the rows' clipped fractions, over the non-empty rows (maxima negated: one min for both)
    fractions = torch.stack((low, -high)) / n.clamp(min=1)  # (2, B)
    row_min = extreme(torch.where(n > 0, fractions, math.inf), "min", rows=False)  # (2,)
    # the range, where no valid token was found (+-big) as +-inf
    ends = torch.stack((c.lo, c.hi))
    ends = torch.where(ends.abs() >= torch.finfo(ends.dtype).max, ends * math.inf, ends)
    row_low_min, neg_row_high_max = row_min.to(ends.dtype).unbind()
    lo, hi = ends.unbind()
    return ClipStats(
        num_tokens=totals[0],
        num_clipped_low=totals[1],
        num_clipped_high=totals[2],
        num_clipped_dual=totals[3] if dual else None,
        log_ratio_min=lo,
        log_ratio_max=hi,
        row_clip_low_min=row_low_min,
        row_clip_high_max=-neg_row_high_max,
    )


def total(per_row: Tensor) -> Tensor:
    """The exact int64 totals of per-row float counts. Shape: (..., B) -> (...)."""
    return per_row.to(torch.int64).sum(-1)


def extreme(x: Tensor, kind: str, rows: bool = True) -> Tensor:
    """Min or max over all of ``x`` (``rows``), or over its last axis: +inf or -inf where it is
    empty. Shape: (B, T), (B,) or (N,) -> (); with ``rows=False`` (K, B) -> (K,).
    Rows first where traced, so that compiled code takes them in the pass that makes the row
    sums; eagerly in one reduction (the same value: a min or max is exact)."""
    if x.numel() == 0:
        shape = () if rows else x.shape[:-1]
        return x.new_full(shape, math.inf if kind == "min" else -math.inf)
    if x.dim() == 2 and (not rows or torch.compiler.is_compiling()):
        x = x.amin(-1) if kind == "min" else x.amax(-1)
    if not rows:
        return x
    return x.amin() if kind == "min" else x.amax()
