"""Clip statistics, and the metrics made from them locally or after a reduction across processes.

A :class:`ClipStats` holds sums and extrema only, so a global reduction is exact: all-reduce
:func:`sums` with SUM and :func:`minima` with MIN (maxima are stored negated), then call
:func:`metrics`. Both adapters do exactly this (TRL across processes; verl per micro-batch, since
verl averages the values itself). The metrics are defined in docs/semantics.md ("Metrics").
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

METRIC_KEYS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "log_ratio/min",
    "log_ratio/max",
    "clip_ratio/dual_mean",  # only with a dual clip
    "kl",  # only with beta != 0
)


class ClipStats(NamedTuple):
    """Counts and extrema over the valid tokens of one call: enough for an exact global reduction.

    Shape: every field is 0-d; counts are int64.
    """

    num_tokens: Tensor
    num_clipped_low: Tensor  # A < 0 and r < -eps_low
    num_clipped_high: Tensor  # A > 0 and r > eps_high
    num_clipped_dual: Tensor | None  # A < 0 and r > log dual_clip; None without a dual clip
    log_ratio_min: Tensor  # +inf when there is no valid token
    log_ratio_max: Tensor  # -inf when there is no valid token
    row_clip_low_min: Tensor  # min over non-empty rows of the row's low-clipped fraction
    row_clip_high_max: Tensor  # max over non-empty rows of the row's high-clipped fraction

    def metrics(self, kl_sum: Tensor | None = None) -> dict[str, Tensor]:
        """The local metrics of this call (no reduction across processes)."""
        dual = self.num_clipped_dual is not None
        return metrics(sums(self, kl_sum), minima(self), dual, kl=kl_sum is not None)


def sums(stats: ClipStats, kl_sum: Tensor | None = None) -> Tensor:
    """What is summed across processes: ``[tokens, clipped low, high, dual, kl_sum]`` (0 where
    absent). Shape: (5,) float64 (exact counts far beyond float32's 2^24)."""
    zero = stats.num_tokens.new_zeros(())
    dual = zero if stats.num_clipped_dual is None else stats.num_clipped_dual
    kl = zero if kl_sum is None else kl_sum.detach()
    parts = (stats.num_tokens, stats.num_clipped_low, stats.num_clipped_high, dual, kl)
    return torch.stack([p.to(torch.float64) for p in parts])


def minima(stats: ClipStats) -> Tensor:
    """What is min-reduced across processes: ``[log_ratio_min, -log_ratio_max, row_clip_low_min,
    -row_clip_high_max]``. Shape: (4,), the statistics' float dtype."""
    parts = (
        stats.log_ratio_min,
        -stats.log_ratio_max,
        stats.row_clip_low_min,
        -stats.row_clip_high_max,
    )
    return torch.stack([p.to(stats.log_ratio_min.dtype) for p in parts]).detach()


def metrics(sums: Tensor, minima: Tensor, dual: bool, kl: bool = False) -> dict[str, Tensor]:
    """The metrics from (reduced) :func:`sums` and :func:`minima`, as 0-d tensors of ``minima``'s
    dtype. Fractions are 0 and extrema NaN when there is no valid token; ``clip_ratio/dual_mean``
    only with a dual clip and ``kl`` (token mean of k3) only when ``kl``."""
    dt = minima.dtype
    num, low, high, n_dual, kl_sum = (s.to(dt) for s in sums.unbind())
    n = num.clamp(min=1)
    has = num > 0
    nan = torch.full_like(n, float("nan"))
    lr_min, neg_lr_max, row_low, neg_row_high = minima.unbind()
    out = {
        "clip_ratio/low_mean": low / n,
        "clip_ratio/high_mean": high / n,
        "clip_ratio/region_mean": (low + high) / n,
        "clip_ratio/low_min": torch.where(has, row_low, nan),
        "clip_ratio/high_max": torch.where(has, -neg_row_high, nan),
        "log_ratio/min": torch.where(has, lr_min, nan),
        "log_ratio/max": torch.where(has, -neg_lr_max, nan),
    }
    if dual:
        out["clip_ratio/dual_mean"] = n_dual / n
    if kl:
        out["kl"] = kl_sum / n
    return out
