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
    largest float) where there is none (:func:`unreached` turns them into ±inf).
    Shape: (B, T) or (N,) -> (), ()."""
    # invalid tokens are pushed out of reach by the largest float
    big = torch.finfo(r.dtype).max
    far = torch.addcmul(r.new_full((), big), mf, r.new_full((), -big))  # 0 at valid tokens
    return extreme(r + far, "min"), extreme(r - far, "max")


def clip_stats(c: Cuts, adv: Tensor, n: Tensor, dual: bool = True) -> ClipStats:
    """Counts and extrema over valid tokens (S10), from where the trust region cut (``c``: the
    range of the log-ratio over valid tokens, and per row the number of tokens cut, ``sum |s|``,
    and ``sum s``) and the row's valid tokens ``n``. Without ``dual`` (no dual clip),
    ``num_clipped_dual`` is None: built so, not replaced afterwards (torch 2.4's ``torch.compile``
    cannot trace ``NamedTuple._replace``).

    Shape: c.lo, c.hi (); c.cut_rows, c.signed_rows, adv, n (B,).
    """
    lo, hi = c.lo, c.hi
    at_eps = (c.cut_rows - c.signed_rows) / 2  # (B,)
    at_cap = (c.cut_rows + c.signed_rows) / 2  # (B,) A < 0 rows only
    low = torch.where(adv < 0, at_eps, 0)
    high = torch.where(adv > 0, at_eps, 0)
    nonempty = n > 0
    nf = n.clamp(min=1)
    big = torch.finfo(lo.dtype).max
    return ClipStats(
        num_tokens=total(n),
        num_clipped_low=total(low),
        num_clipped_high=total(high),
        num_clipped_dual=total(at_cap) if dual else None,
        log_ratio_min=unreached(lo, big),
        log_ratio_max=unreached(hi, big),
        row_clip_low_min=extreme(torch.where(nonempty, low / nf, math.inf), "min").to(lo.dtype),
        row_clip_high_max=extreme(torch.where(nonempty, high / nf, -math.inf), "max").to(lo.dtype),
    )


def total(per_row: Tensor) -> Tensor:
    """The exact int64 total of per-row float counts. Shape: (B,) -> ()."""
    return per_row.to(torch.int64).sum()


def extreme(x: Tensor, kind: str) -> Tensor:
    """Min or max over all of ``x``: +inf or -inf when it is empty. Shape: (B, T), (B,) or
    (N,) -> ().
    Rows first, so that compiled code takes them in the pass that makes the row sums."""
    if x.numel() == 0:
        return x.new_full((), math.inf if kind == "min" else -math.inf)
    if x.dim() == 2:
        x = x.amin(-1) if kind == "min" else x.amax(-1)
    return x.amin() if kind == "min" else x.amax()


def unreached(x: Tensor, big: float) -> Tensor:
    """±inf where an extremum over valid tokens found none (it reads ±``big`` then)."""
    return torch.where(x.abs() >= big, x.sign() * math.inf, x)
