"""DAPO and CISPO as a TRL user gets them: TRL 1.16's ``loss_type="dapo"`` at ``GRPOConfig``'s
defaults and ``loss_type="cispo"`` at the cap TRL's documentation recommends, as variants
(``dapo_trl``, ``cispo_trl``) for the plain-PyTorch study (docs/regime_plan.md).

The variants ``dapo`` and ``cispo`` (:mod:`gmpo_variants.hosts`) are verl's code at verl's
settings: DAPO's clip-higher (0.2, 0.28) with verl's dual clip, CISPO's weight clamped to
[0.8, 1.2]. These two are TRL's (``trl/trainer/grpo_trainer.py``, ``_compute_loss``; the
settings from ``trl/trainer/grpo_config.py``):

- ``dapo_trl``: PPO's clipped ratio per token, ``epsilon`` 0.2 and ``epsilon_high`` unset, so
  0.2 too (TRL's defaults: a ratio clip [0.8, 1.2]); ``delta`` None (no dual clip); the token
  losses summed over the batch and divided by its valid tokens (TRL's ``num_items_in_batch``
  for one accumulation window that holds the batch);
- ``cispo_trl``: -sg(min(ρ, ``epsilon_high``))·A·log π per token, no lower clip, with
  ``epsilon_high`` 5.0, the value TRL's ``epsilon_high`` documentation recommends for CISPO
  (after ScaleRL); left unset it would be ``epsilon``, 0.2, a cap below 1 on every weight;
  aggregated as ``dapo_trl``.

GSPO as TRL documents it (``loss_type="grpo"``, ``importance_sampling_level="sequence"``, ε
(3e-4, 4e-4)) is verl's ``gspo`` variant already, equal in loss and gradient
(tests/variants/test_hosts.py). ``tests/trl/test_variants_trl_defaults.py`` checks both of these
against TRL's own loss step. Their inputs are a variant's: the token mean is over the call's
batch, so a study that splits a generation batch into minibatches normalizes each update by its
own minibatch's tokens, where TRL divides by the generation batch's average per optimizer step
(the same for answers of one length).
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import Tensor

from gmpo_variants.grpo import clipped_fraction, ratio_bounds
from gmpo_variants.recipes import reference_inputs
from gmpo_variants.registry import register

#: TRL's ``GRPOConfig`` defaults: ``epsilon`` 0.2, ``epsilon_high`` None (read as ``epsilon``)
DAPO_EPSILON = 0.2
#: the weight's cap for CISPO that TRL's ``epsilon_high`` documentation recommends
CISPO_CAP = 5.0


def _token_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """The sum over the batch's valid tokens divided by their number (at least 1)."""
    valid = mask != 0
    return torch.where(valid, per_token, 0).sum() / valid.sum().clamp(min=1)


def dapo_trl_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon: float = DAPO_EPSILON,
    epsilon_high: float | None = None,
) -> Tensor:
    """TRL's ``loss_type="dapo"`` without KL or ``delta``: -min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)
    per token, the batch's token mean.

    Shape:
        logp, old_logp, mask: (B, T). advantages: (B,). Output: 0-d.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    a = advantages[:, None]  # (B, 1)
    rho = torch.exp(torch.where(mask != 0, logp - old_logp, 0))  # (B, T)
    objective = torch.minimum(rho * a, rho.clamp(1 - epsilon, 1 + eps_high) * a)  # (B, T)
    return -_token_mean(objective, mask)


def cispo_trl_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cap: float = CISPO_CAP
) -> Tensor:
    """TRL's ``loss_type="cispo"`` without KL: -sg(min(ρ, cap))·A·log π per token, the batch's
    token mean.

    Shape:
        logp, old_logp, mask: (B, T). advantages: (B,). Output: 0-d.
    """
    rho = torch.exp(torch.where(mask != 0, logp - old_logp, 0)).detach()  # (B, T)
    return -_token_mean(rho.clamp(max=cap) * advantages[:, None] * logp, mask)


def dapo_trl_reference(
    logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike, mask: ArrayLike
) -> float:
    """:func:`dapo_trl_loss`'s value at TRL's defaults in float64:
    -sum valid·min(ρ·A, clip(ρ, 0.8, 1.2)·A) / max(N, 1)."""
    r, adv, valid, n = reference_inputs(logp, old_logp, advantages, mask)
    with np.errstate(over="ignore", invalid="ignore"):
        rho, a = np.exp(r), adv[:, None]
        o = np.minimum(rho * a, np.clip(rho, 1 - DAPO_EPSILON, 1 + DAPO_EPSILON) * a)
    return float(-np.where(valid, o, 0.0).sum() / max(n.sum(), 1.0))


def cispo_trl_reference(
    logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike, mask: ArrayLike
) -> float:
    """:func:`cispo_trl_loss`'s value in float64: -sum valid·min(ρ, 5)·A·log π / max(N, 1)."""
    r, adv, valid, n = reference_inputs(logp, old_logp, advantages, mask)
    lp = np.asarray(logp, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        term = np.minimum(np.exp(r), CISPO_CAP) * adv[:, None] * lp
    return float(-np.where(valid, term, 0.0).sum() / max(n.sum(), 1.0))


@register(
    "dapo_trl",
    label="DAPO: TRL's default loss_type='dapo', ratio clip [0.8, 1.2], token-mean, no delta",
    bounds=ratio_bounds(DAPO_EPSILON),
    reference=dapo_trl_reference,
)
def dapo_trl(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`dapo_trl_loss` at TRL's defaults and its clipped fraction (TRL's
    ``clip_ratio``: A > 0 and ρ > 1.2, A < 0 and ρ < 0.8)."""
    loss = dapo_trl_loss(logp, old_logp, advantages, mask)
    bounds = ratio_bounds(DAPO_EPSILON)
    return loss, clipped_fraction((logp - old_logp).detach(), advantages, mask, bounds)


@register(
    "cispo_trl",
    label="CISPO: TRL's loss_type='cispo', weight cap 5 (epsilon_high), no floor, token-mean",
    reference=cispo_trl_reference,
)
def cispo_trl(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`cispo_trl_loss` at the cap 5.0 and the fraction of valid tokens TRL counts as
    clipped (``cispo_clip_ratio``: A > 0 and ρ > cap). Their gradient is kept, scaled by the
    cap: nothing is removed, so no bounds."""
    loss = cispo_trl_loss(logp, old_logp, advantages, mask)
    valid = mask != 0
    rho = torch.exp(torch.where(valid, logp - old_logp, 0)).detach()
    capped = valid & (rho > CISPO_CAP) & (advantages[:, None] > 0)
    return loss, (capped.sum() / valid.sum().clamp(min=1)).float()
