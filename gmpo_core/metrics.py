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
    zero = stats.num_tokens.new_zeros((), dtype=torch.float64)
    dual = zero if stats.num_clipped_dual is None else stats.num_clipped_dual
    kl = zero if kl_sum is None else kl_sum.detach().to(torch.float64)
    # one float64 part makes the stack float64 (type promotion): one kernel, counts exact
    return torch.stack((stats.num_tokens, stats.num_clipped_low, stats.num_clipped_high, dual, kl))


def minima(stats: ClipStats) -> Tensor:
    """What is min-reduced across processes: ``[log_ratio_min, -log_ratio_max, row_clip_low_min,
    -row_clip_high_max]``. Shape: (4,), the statistics' float dtype."""
    parts = (  # maxima stored negated
        stats.log_ratio_min,
        -stats.log_ratio_max,
        stats.row_clip_low_min,
        -stats.row_clip_high_max,
    )
    return torch.stack(parts).detach()


def metrics(sums: Tensor, minima: Tensor, dual: bool, kl: bool = False) -> dict[str, Tensor]:
    """The metrics from (reduced) :func:`sums` and :func:`minima`, as 0-d tensors of ``minima``'s
    dtype. Fractions are 0 and extrema NaN when there is no valid token; ``clip_ratio/dual_mean``
    only with a dual clip and ``kl`` (token mean of k3) only when ``kl``. ``sums`` may also be
    its first 3 entries (no dual clip, no KL) or 4 (no KL)."""
    dt = minima.dtype
    # select/narrow, not []: indexing a tensor needs a device guard for it (fake CUDA tensors
    # of a CPU-only torch have none)
    num = sums.select(0, 0)
    # [tokens / tokens (unused), low, high, then dual and kl where given]
    fractions = (sums / num.clamp(min=1)).to(dt)
    extrema = torch.where(num > 0, minima, float("nan"))  # (4,) maxima negated
    parts = fractions.unbind()
    low, high = parts[1], parts[2]
    lr_min, neg_lr_max, row_low, neg_row_high = extrema.unbind()
    out = {
        "clip_ratio/low_mean": low,
        "clip_ratio/high_mean": high,
        "clip_ratio/region_mean": low + high,
        "clip_ratio/low_min": row_low,
        "clip_ratio/high_max": -neg_row_high,
        "log_ratio/min": lr_min,
        "log_ratio/max": -neg_lr_max,
    }
    if dual:
        out["clip_ratio/dual_mean"] = parts[3]
    if kl:
        out["kl"] = parts[4]
    return out
