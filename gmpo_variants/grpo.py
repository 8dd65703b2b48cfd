"""GRPO (TRL's ``loss_type="grpo"``): the arithmetic token mean of PPO's clipped ratio objective,
clip in ratio space, a token mean per row, then the mean over rows; docs/recipes.md's recipe,
its float64 counterpart and the registered ``grpo`` (ratio clip 1 ± 0.2) and ``grpo_wide``
(ratio clip (e^-0.4, e^0.4), GMPO's range). ``tests/trl/test_variants_grpo.py`` checks both
against TRL's own loss step."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from gmpo_core import clip_metrics, reference
from gmpo_core.options import EPSILON, upper
from gmpo_variants.recipes import reference_inputs
from gmpo_variants.registry import register


def grpo_arithmetic_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.2, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """GRPO: arithmetic token mean of PPO's clipped ratio objective, clip in ratio space."""
    eps_high = upper(epsilon, epsilon_high)  # None means epsilon
    a = advantages[:, None]  # (B, 1)
    valid = (mask != 0) & (a != 0)  # (B, T)
    rho = torch.exp(torch.where(valid, logp - old_logp, 0))  # (B, T)
    objective = torch.minimum(rho * a, rho.clamp(1 - epsilon, 1 + eps_high) * a)  # (B, T)
    per_row = torch.where(valid, objective, 0).sum(-1) / valid.sum(-1).clamp(min=1)  # (B,)
    return -per_row.mean()


def grpo_arithmetic_reference(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
    mask: ArrayLike, epsilon: float = 0.2, epsilon_high: float | None = None) -> float:  # fmt: skip
    """-sum_t valid·min(ρ_t·A_i, clip(ρ_t, 1-ε_l, 1+ε_h)·A_i) / max(n_i, 1), ρ = exp(r), in
    float64; rows with n_i = 0 or A_i = 0 give exactly 0."""
    eps_l, eps_h = reference.check_epsilons(epsilon, epsilon_high)
    r, adv, valid, n = reference_inputs(logp, old_logp, advantages, mask)
    with np.errstate(over="ignore", invalid="ignore"):
        rho = np.exp(np.where(adv[:, None] != 0, r, 0.0))  # (B, T)
        o = np.minimum(rho * adv[:, None], np.clip(rho, 1 - eps_l, 1 + eps_h) * adv[:, None])
    row = -np.where(valid, o, 0.0).sum(axis=1) / np.maximum(n, 1.0)  # (B,)
    return float(np.mean(np.where((adv != 0) & (n > 0), row, 0.0)))


def ratio_bounds(epsilon: float, epsilon_high: float | None = None) -> tuple[float, float]:
    """A ratio-space clip ``[1 - epsilon, 1 + epsilon_high]`` as log-space bounds ``(low,
    high)``: ``(-log(1 - epsilon), log(1 + epsilon_high))``."""
    return -math.log1p(-epsilon), math.log1p(upper(epsilon, epsilon_high))


def clipped_fraction(
    r: Tensor, advantages: Tensor, mask: Tensor, bounds: tuple[float, float]
) -> Tensor:
    """Fraction of valid tokens the one-sided clip (log-space ``bounds``) zeroes the gradient
    of (0-d, float32)."""
    stats = clip_metrics(r, advantages, mask, epsilon=bounds[0], epsilon_high=bounds[1])
    clipped = stats.num_clipped_low + stats.num_clipped_high
    return (clipped / stats.num_tokens.clamp(min=1)).float()


def grpo_variant(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """TRL's ``loss_type="grpo"`` (no KL, no ``delta``): :func:`grpo_arithmetic_loss` and its
    clipped fraction."""
    loss = grpo_arithmetic_loss(logp, old_logp, advantages, mask, epsilon, epsilon_high)
    bounds = ratio_bounds(epsilon, epsilon_high)
    return loss, clipped_fraction((logp - old_logp).detach(), advantages, mask, bounds)


WIDE = EPSILON  # GMPO's log-space epsilon: grpo_wide's ratio range is (e^-0.4, e^0.4)
_WIDE = {"epsilon": -math.expm1(-WIDE), "epsilon_high": math.expm1(WIDE)}

register(
    "grpo",
    label="GRPO, ratio clip 1 ± 0.2",
    bounds=ratio_bounds(0.2),
    reference=functools.partial(grpo_arithmetic_reference, epsilon=0.2),
)(grpo_variant)


@register(
    "grpo_wide",
    label="GRPO, ratio clip (e^-0.4, e^0.4)",
    bounds=(WIDE, WIDE),
    reference=functools.partial(grpo_arithmetic_reference, **_WIDE),
)
def grpo_wide(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`grpo_variant` with GMPO's range in ratio space, (e^-0.4, e^0.4)."""
    return grpo_variant(logp, old_logp, advantages, mask, **_WIDE)
