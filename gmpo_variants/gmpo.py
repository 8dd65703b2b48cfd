"""GMPO (arXiv 2507.20673, Eq. 4) as a variant, and docs/recipes.md's GMPO recipes: the
token-level clip in log space, then the geometric mean of the ratios.

The registered ``gmpo`` and ``gmpo_narrow`` are :func:`gmpo_core.gmpo_loss` at ε 0.4 and 0.2;
their reference is ``gmpo_core.reference.gmpo_loss``. The recipes build the same loss from the
public blocks (``tests/variants/`` checks that they are equal)."""

from __future__ import annotations

import functools

import torch
from numpy.typing import ArrayLike
from torch import Tensor

import gmpo_core.reference
from gmpo_core import clip_log_ratio, gmpo_loss, masked_geometric_mean, trust_region_log_ratio
from gmpo_core.options import EPSILON
from gmpo_variants.recipes import masked_log_ratio, policy_loss
from gmpo_variants.registry import register


def gmpo_from_blocks(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = EPSILON, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """GMPO (paper Eq. 4): per-token log-space clip, then the geometric mean of the ratios."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    c = trust_region_log_ratio(r, advantages, epsilon=epsilon, epsilon_high=epsilon_high)  # (B, T)
    log_coef = masked_geometric_mean(c, valid)  # (B,) sum_t c_t / |o_i|
    return policy_loss(advantages, log_coef, valid)


def asymmetric_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = EPSILON, epsilon_high: float | None = 0.6, *, impl: str = "plain") -> Tensor:  # fmt: skip
    """GMPO with the clip range (e^-epsilon, e^epsilon_high)."""
    out = gmpo_loss(
        logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high, impl=impl
    )
    return out.loss


def asymmetric_clip_from_blocks(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = EPSILON, epsilon_high: float | None = 0.6) -> Tensor:  # fmt: skip
    """GMPO with an asymmetric clip range, through PPO's min/max form of the trust region."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    clipped = clip_log_ratio(r, epsilon=epsilon, epsilon_high=epsilon_high)  # (B, T)
    positive = (advantages >= 0)[:, None]  # (B, 1)
    c = torch.where(positive, torch.minimum(r, clipped), torch.maximum(r, clipped))  # (B, T)
    return policy_loss(advantages, masked_geometric_mean(c, valid), valid)


def token_clip_reference(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
    mask: ArrayLike, epsilon: float = EPSILON, epsilon_high: float | None = None) -> float:  # fmt: skip
    """The float64 counterpart: ``gmpo_core.reference.gmpo_loss``'s value."""
    return gmpo_core.reference.gmpo_loss(
        logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high
    ).loss


def gmpo_variant(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, epsilon: float = EPSILON
) -> tuple[Tensor, Tensor]:
    """``gmpo_core.gmpo_loss`` at the log-space clip ±``epsilon``: the loss and the fraction of
    valid tokens the trust region clipped."""
    out = gmpo_loss(logp, old_logp, advantages, mask, epsilon=epsilon)
    return out.loss, out.metrics["clip_ratio/region_mean"].float()


register(
    "gmpo",
    label="GMPO, log-ratio clip ± 0.4",
    bounds=(0.4, 0.4),
    reference=functools.partial(token_clip_reference, epsilon=EPSILON),
)(gmpo_variant)


@register(
    "gmpo_narrow",
    label="GMPO, log-ratio clip ± 0.2",
    bounds=(0.2, 0.2),
    reference=functools.partial(token_clip_reference, epsilon=0.2),
)
def gmpo_narrow(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`gmpo_variant` at ε 0.2 (the paper's e^±0.2 row)."""
    return gmpo_variant(logp, old_logp, advantages, mask, epsilon=0.2)
