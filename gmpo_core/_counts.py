"""Counts and extrema over valid tokens (S10): where the trust region cut (:class:`Cuts`), their
totals and extrema as one :class:`Tally` (two small tensors, made with as few tensor calls as
their values allow: on a small batch every call costs its dispatch, whatever its size;
docs/benchmarks.md), and the :class:`~gmpo_core.metrics.ClipStats` read from a tally."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from gmpo_core._rows import Segments, constant, row_sum
from gmpo_core.metrics import ClipStats, metrics


class Cuts(NamedTuple):
    """Where the trust region cut, with s = -1 where the clamp cut q at eps, +1 at the dual cap,
    0 elsewhere (invalid tokens too): ``s`` per token, per row ``sum |s|`` and ``sum s``, and
    the range of the log-ratio over valid tokens, its maximum negated (:func:`log_ratio_range`). Without a dual clip
    ``s`` is never positive.

    Shape: s (B, T) or (N,); cut_rows, signed_rows (B,); lo, neg_hi ().
    """

    s: Tensor
    cut_rows: Tensor
    signed_rows: Tensor
    lo: Tensor  # min r
    neg_hi: Tensor  # -max r


class Tally(NamedTuple):
    """The clip statistics of one call (S10) as two tensors.

    Shape:
        sums: (3,) or, with a dual clip, (4,) float64: ``[tokens, clipped low, clipped high,
        (clipped dual)]``, the first entries of :func:`gmpo_core.metrics.sums`.
        minima: (4,), the layout of :func:`gmpo_core.metrics.minima`: ``[min r, -max r, row low
        min, -row high max]``, all +inf where there is no valid token.
    """

    sums: Tensor
    minima: Tensor

    def stats(self) -> ClipStats:
        """The same statistics as a :class:`~gmpo_core.metrics.ClipStats` (counts int64)."""
        counts = self.sums.to(torch.int64).unbind()
        lo, neg_hi, row_low, neg_row_high = self.minima.unbind()
        return ClipStats(
            num_tokens=counts[0],
            num_clipped_low=counts[1],
            num_clipped_high=counts[2],
            num_clipped_dual=counts[3] if len(counts) > 3 else None,
            log_ratio_min=lo,
            log_ratio_max=-neg_hi,
            row_clip_low_min=row_low,
            row_clip_high_max=-neg_row_high,
        )

    def metrics(self, kl_sum: Tensor | None = None) -> dict[str, Tensor]:
        """The local metrics: what ``self.stats().metrics(kl_sum)`` gives, without making the
        record."""
        sums, dual = self.sums, self.sums.shape[0] > 3
        if kl_sum is not None:  # the KL sum in its slot of :func:`gmpo_core.metrics.sums`
            kl = kl_sum.detach().to(torch.float64).reshape(1)
            sums = torch.cat((sums, kl) if dual else (sums, torch.zeros_like(kl), kl))
        return metrics(sums, self.minima, dual, kl=kl_sum is not None)


def log_ratio_range(r: Tensor, mf: Tensor) -> tuple[Tensor, Tensor]:
    """Min of ``r`` and min of ``-r`` (the max negated) over valid tokens (``mf``: 0/1), ``+big``
    (the dtype's largest float) where there is none (:func:`tally` turns it into +inf).
    Shape: (B, T) or (N,) -> (), ()."""
    # invalid tokens are pushed out of reach by the largest float (one pass; a log of mf, which
    # would give ±inf at once, is ~20x slower on CPU, where most of mf is 1 and log(0) is slow)
    big = torch.finfo(r.dtype).max
    far = torch.rsub(mf, big, alpha=big)  # big - big mf: 0 at valid tokens
    return extreme(r + far, "min"), extreme(far - r, "min")


def clip_signs(
    r: Tensor, q: Tensor, cq: Tensor, mf: Tensor, seg: Segments | None, dual: bool = True
) -> Cuts:
    """Where the trust region cut q (:class:`Cuts`). Without ``dual`` (no dual clip) ``s`` is
    never positive: ``|s| = -s``, and the cut rows are the negated signed rows, one row sum fewer.
    Shape: r, q, cq, mf (B, T) or (N,)."""
    lo, neg_hi = log_ratio_range(constant(r), mf)  # first: fewer (B, T) tensors alive at once
    s = torch.sign(constant(cq) - constant(q))  # (B, T)
    signed = row_sum(s, seg, exact=True)
    cut = row_sum(s.abs(), seg, exact=True) if dual else -signed
    return Cuts(s, cut, signed, lo, neg_hi)


def passes(mf: Tensor, c: Cuts, dual: bool = True) -> Tensor:
    """1 at the valid tokens where the trust region passes the gradient (S1), else 0:
    ``mf - |s|``. Shape: (B, T) or (N,)."""
    return mf - c.s.abs() if dual else mf + c.s


def tally(c: Cuts, sign: Tensor, n: Tensor, nf: Tensor | None = None, dual: bool = True) -> Tally:
    """Counts and extrema over valid tokens (S10), from where the trust region cut (``c``),
    ``sign`` = sign(A) (-1, 0 or 1) and each row's valid tokens ``n``. Without ``dual`` (no dual
    clip) there is no count at the cap.

    A row's tokens cut at eps are ``(sum |s| - sum s) / 2`` (``-sum s`` without a dual clip);
    they count low where A < 0 and high where A > 0. Each row's ``[low, -high]`` is one product
    with ``[min(sign, 0), max(sign, 0)]``; the totals are one sum (absolute values: exact
    integers, the high one negated) and the rows' clipped fractions one min over the non-empty
    rows (the maxima negated, as :func:`gmpo_core.metrics.minima` has them).

    ``nf``: ``n.clamp(min=1)``, where the caller has it.

    Shape: c.lo, c.neg_hi (); c.cut_rows, c.signed_rows, sign, n, nf (B,).
    """
    neg_at_eps = (c.signed_rows - c.cut_rows) / 2 if dual else c.signed_rows  # (B,)
    rows = neg_at_eps * torch.stack((sign.clamp(max=0), sign.clamp(min=0)))  # (2, B) low, -high
    per_row = [n.unsqueeze(0), rows]
    if dual:  # at the cap: A < 0 rows only
        per_row.append(((c.cut_rows + c.signed_rows) / 2).unsqueeze(0))
    sums = torch.cat(per_row).sum(-1, dtype=torch.float64).abs()  # exact: integers
    nf = n.clamp(min=1) if nf is None else nf
    fractions = torch.where(n > 0, rows / nf, math.inf)  # (2, B), empty rows out
    minima = torch.cat((torch.stack((c.lo, c.neg_hi)), extreme(fractions, "min", rows=False)))
    # the range where no token was valid: ±big, the entries +inf then (the fractions' are too)
    minima = torch.where(minima >= torch.finfo(c.lo.dtype).max, math.inf, minima)
    return Tally(sums, minima if minima.dtype == c.lo.dtype else minima.to(c.lo.dtype))


def clip_stats(c: Cuts, sign: Tensor, n: Tensor, dual: bool = True) -> ClipStats:
    """:func:`tally` as a :class:`~gmpo_core.metrics.ClipStats`."""
    return tally(c, sign, n, dual=dual).stats()


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
