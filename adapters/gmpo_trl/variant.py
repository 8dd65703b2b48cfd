"""``GMPOConfig.loss_variant`` in ``GMPOTrainer``'s loss step: the variant's call, and its
metrics' states (:class:`gmpo_kit.MetricStates`), which the trainer reduces across processes.
No loss math here: the variant is ``gmpo_variants``' (or the user's ``module:function``), the
statistics are ``gmpo_core.clip_metrics``'."""

from __future__ import annotations

import torch
from torch import Tensor

from gmpo_core import ClipStats, clip_metrics
from gmpo_kit import MetricStates, Reduced
from gmpo_variants import Variant

#: a loss variant's clipped fraction, apart from the core's ``clip_ratio/*``
VARIANT_CLIP = "variant/clip_ratio"
# the tokens the clipped fraction is over (a state, not logged)
_TOKENS = "variant/tokens"


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


def add_states(states: MetricStates, stats: ClipStats, clipped: Tensor) -> None:
    """What the metrics are made of: the clipped fraction ``clipped`` weighted by
    ``stats.num_tokens`` and that count (summed across processes), and the log-ratio's range."""
    n = stats.num_tokens.to(torch.float64)
    states.sum(VARIANT_CLIP, torch.where(n > 0, clipped.detach().to(torch.float64) * n, 0))
    states.sum(_TOKENS, n)
    states.min("log_ratio/min", stats.log_ratio_min)
    states.max("log_ratio/max", stats.log_ratio_max)


def metrics(reduced: Reduced) -> dict[str, Tensor]:
    """The metrics from reduced :func:`add_states`: :data:`VARIANT_CLIP` (a token mean over
    processes), ``log_ratio/min`` and ``log_ratio/max``, NaN where there is no token."""
    lo, hi = reduced["log_ratio/min"], reduced["log_ratio/max"]
    return {
        VARIANT_CLIP: reduced.fraction(VARIANT_CLIP, _TOKENS),
        "log_ratio/min": torch.where(lo.isfinite(), lo, float("nan")),
        "log_ratio/max": torch.where(hi.isfinite(), hi, float("nan")),
    }
