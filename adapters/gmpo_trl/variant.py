"""``GMPOConfig.loss_variant`` in ``GMPOTrainer``'s loss step: the variant's call, and its
metrics' per-process parts, which the trainer reduces across processes. No loss math here: the
variant is ``gmpo_variants``' (or the user's ``module:function``), the statistics are
``gmpo_core.clip_metrics``'."""

from __future__ import annotations

import torch
from torch import Tensor

from gmpo_core import ClipStats, clip_metrics
from gmpo_variants import Variant

#: a loss variant's clipped fraction, apart from the core's ``clip_ratio/*``
VARIANT_CLIP = "variant/clip_ratio"


def variant_loss(
    variant: Variant, logps: Tensor, old_logps: Tensor | None, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, ClipStats]:
    """A loss variant's ``(loss, clipped fraction)`` on the policy term's tokens ``mask`` (old
    log-probs ``logps.detach()`` on-policy; the fraction NaN, unknown, where the variant returns
    the loss alone), and the log-ratio's statistics for the metrics (its range and token count
    are read).

    Shape:
        logps, old_logps, mask: (B, T). advantages: (B,). Output: (), (), ClipStats.
    """
    old = logps.detach() if old_logps is None else old_logps
    loss, clipped = variant(logps, old, advantages, mask)
    stats = clip_metrics(logps.detach() - old.detach(), advantages, mask)
    return loss, clipped, stats


def local_metrics(
    stats: ClipStats, clipped: Tensor, entropies: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """What is summed across processes, ``[clipped tokens, tokens, entropy sum, entropy
    tokens]`` (float64: the clipped fraction ``clipped`` weighted by ``stats.num_tokens``, the
    entropy over ``mask``), and what is min-reduced, ``[log_ratio_min, -log_ratio_max]``.

    Shape:
        entropies, mask: (B, T). Output: (4,), (2,).
    """
    f64 = torch.float64
    n = stats.num_tokens.to(f64)
    sums = torch.stack(
        [
            torch.where(n > 0, clipped.detach().to(f64) * n, 0),
            n,
            torch.where(mask, entropies.detach().to(f64), 0).sum(),
            mask.sum().to(f64),
        ]
    )
    return sums, torch.stack([stats.log_ratio_min, -stats.log_ratio_max]).float()


def metrics(sums: Tensor, minima: Tensor) -> dict[str, Tensor]:
    """The metrics from reduced :func:`local_metrics`: :data:`VARIANT_CLIP`, ``log_ratio/min``,
    ``log_ratio/max`` and ``entropy``, NaN where there is no token."""
    nan = torch.full_like(sums[0], float("nan"))
    lo, neg_hi = minima.unbind()
    return {
        VARIANT_CLIP: torch.where(sums[1] > 0, sums[0] / sums[1].clamp(min=1), nan),
        "log_ratio/min": torch.where(lo.isfinite(), lo, nan),
        "log_ratio/max": torch.where(neg_hi.isfinite(), -neg_hi, nan),
        "entropy": torch.where(sums[3] > 0, sums[2] / sums[3].clamp(min=1), nan),
    }
