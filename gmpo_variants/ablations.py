"""The paper's ablations (arXiv 2507.20673, Sec. 4) as variants, with docs/recipes.md's recipes
and their float64 counterparts: the sequence-level clip (paper: 52.6), no length normalization
(52.0) and no clip (52.3), against GMPO's token clip (52.7)."""

from __future__ import annotations

import functools

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from gmpo_core import masked_geometric_mean, reference, trust_region_log_ratio
from gmpo_core.options import EPSILON
from gmpo_variants.recipes import (
    masked_log_ratio,
    policy_loss,
    reference_inputs,
    reference_policy_loss,
)
from gmpo_variants.registry import register


def sequence_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = EPSILON, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """Ablation: clip the sequence's mean log-ratio instead of each token's."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    s = masked_geometric_mean(r, valid)  # (B,) unclipped mean log-ratio
    log_coef = trust_region_log_ratio(s, advantages, epsilon=epsilon, epsilon_high=epsilon_high)
    return policy_loss(advantages, log_coef, valid)  # log_coef: (B,)


def no_length_norm_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = EPSILON, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """Ablation: the product of the clipped token ratios, without the 1/|o| root."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    c = trust_region_log_ratio(r, advantages, epsilon=epsilon, epsilon_high=epsilon_high)  # (B, T)
    log_coef = torch.where(valid, c, 0).sum(-1)  # (B,) sum, not mean
    return policy_loss(advantages, log_coef, valid)


def no_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = EPSILON, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """Ablation: the geometric mean of the unclipped ratios (epsilon is ignored)."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    return policy_loss(advantages, masked_geometric_mean(r, valid), valid)


# float64 counterparts, with s_i = sum_t valid * r_t / max(n_i, 1) ---------------------------


def sequence_clip_reference(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
    mask: ArrayLike, epsilon: float = EPSILON, epsilon_high: float | None = None) -> float:  # fmt: skip
    """-A_i·exp(l_i), l_i = min(s_i, ε_h) if A_i >= 0 else max(s_i, -ε_l)."""
    eps_l, eps_h = reference.check_epsilons(epsilon, epsilon_high)
    r, adv, _, n = reference_inputs(logp, old_logp, advantages, mask)
    s = r.sum(axis=1) / np.maximum(n, 1.0)
    return reference_policy_loss(
        adv, np.where(adv >= 0, np.minimum(s, eps_h), np.maximum(s, -eps_l)), n
    )


def no_length_norm_reference(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
    mask: ArrayLike, epsilon: float = EPSILON, epsilon_high: float | None = None) -> float:  # fmt: skip
    """-A_i·exp(sum_t valid·c_t): the product of the clipped ratios, no n-th root."""
    eps_l, eps_h = reference.check_epsilons(epsilon, epsilon_high)
    r, adv, valid, n = reference_inputs(logp, old_logp, advantages, mask)
    c = reference.trust_region(r, adv, eps_l, eps_h, None)[0]
    return reference_policy_loss(adv, np.where(valid, c, 0.0).sum(axis=1), n)


def no_clip_reference(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
    mask: ArrayLike, epsilon: float = EPSILON, epsilon_high: float | None = None) -> float:  # fmt: skip
    """-A_i·exp(s_i) (epsilon is ignored)."""
    r, adv, _, n = reference_inputs(logp, old_logp, advantages, mask)
    return reference_policy_loss(adv, r.sum(axis=1) / np.maximum(n, 1.0), n)


# the registered variants --------------------------------------------------------------------


@register("gmpo_noclip", label="GMPO without clip", reference=no_clip_reference)
def gmpo_noclip(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`no_clip_loss`, the geometric mean of the unclipped ratios; nothing is clipped."""
    return no_clip_loss(logp, old_logp, advantages, mask), logp.new_zeros(())


@register(
    "gmpo_seqclip",
    label="GMPO, sequence-level clip ± 0.4",
    reference=functools.partial(sequence_clip_reference, epsilon=EPSILON),
)
def gmpo_seqclip(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, epsilon: float = EPSILON
) -> tuple[Tensor, Tensor]:
    """:func:`sequence_clip_loss`, the paper's sequence-level clip: the row's mean log-ratio goes
    through the trust region; the clipped fraction counts the tokens of clipped rows."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    s = masked_geometric_mean(r, valid)  # (B,)
    row_clipped = ((advantages > 0) & (s > epsilon)) | ((advantages < 0) & (s < -epsilon))
    tokens = valid.sum(-1)  # (B,)
    frac = torch.where(row_clipped, tokens, 0).sum() / tokens.sum().clamp(min=1)
    loss = sequence_clip_loss(logp, old_logp, advantages, mask, epsilon=epsilon)
    return loss, frac.detach().float()
