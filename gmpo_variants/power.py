"""The power-mean family (PMPO, arXiv 2601.22521; APMPO, arXiv 2605.04066) as variants, with
docs/recipes.md's recipe and its float64 counterpart: the token clip of GMPO, then the power
mean ``M_p`` of the clipped token ratios instead of their geometric mean.

``p = 0`` is GMPO; ``p = -1`` the harmonic mean (HMPO, an ablation of the GMPO paper's own
repository); ``p = 1`` the arithmetic mean, which with the clip in log space is GRPO with the
ratio range ``(e^-ε, e^ε)`` (``grpo_wide`` at ε 0.4; ``tests/variants/`` checks it). The mean
is ``gmpo_core.masked_power_mean``; its rule is docs/semantics.md S17."""

from __future__ import annotations

import functools

from numpy.typing import ArrayLike
from torch import Tensor

from gmpo_core import masked_power_mean, reference, trust_region_log_ratio
from gmpo_core.options import EPSILON
from gmpo_variants.grpo import clipped_fraction
from gmpo_variants.recipes import (
    masked_log_ratio,
    policy_loss,
    reference_inputs,
    reference_policy_loss,
)
from gmpo_variants.registry import LossFn, register


def power_mean_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = EPSILON, epsilon_high: float | None = None, p: float = -1.0) -> Tensor:  # fmt: skip
    """The power-mean family: per-token log-space clip, then the power mean M_p of the ratios
    (p = 0: GMPO; p = -1: HMPO; p = 1: the arithmetic mean)."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    c = trust_region_log_ratio(r, advantages, epsilon=epsilon, epsilon_high=epsilon_high)  # (B, T)
    active = valid & (advantages != 0)[:, None]  # (B, T): an A = 0 row's values never enter
    log_coef = masked_power_mean(c, active, p)  # (B,) log M_p of exp(c) over the row
    return policy_loss(advantages, log_coef, valid)


def power_mean_reference(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
    mask: ArrayLike, epsilon: float = EPSILON, epsilon_high: float | None = None,
    p: float = -1.0) -> float:  # fmt: skip
    """-A_i·M_p(exp(c_i)) in float64, c the one-sided log-space trust region of each token
    (``gmpo_core.reference.trust_region``) and log M_p ``gmpo_core.reference.masked_power_mean``."""
    eps_l, eps_h = reference.check_epsilons(epsilon, epsilon_high)
    r, adv, valid, n = reference_inputs(logp, old_logp, advantages, mask)
    c = reference.trust_region(r, adv, eps_l, eps_h, None)[0]
    return reference_policy_loss(adv, reference.masked_power_mean(c, valid, p).value, n)


def power_mean_variant(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    p: float,
    epsilon: float = EPSILON,
) -> tuple[Tensor, Tensor]:
    """:func:`power_mean_loss` at ``p`` and the log-space clip ±``epsilon``, and the fraction of
    valid tokens whose gradient that clip removed."""
    loss = power_mean_loss(logp, old_logp, advantages, mask, epsilon=epsilon, p=p)
    bounds = (epsilon, epsilon)
    return loss, clipped_fraction((logp - old_logp).detach(), advantages, mask, bounds)


def register_power(name: str, label: str, *, p: float, epsilon: float = EPSILON) -> LossFn:
    """Register the family's member at ``p`` and ``epsilon`` as ``name``, in one registration:
    its loss (:func:`power_mean_variant`), clip bounds ``(epsilon, epsilon)`` and float64
    reference (:func:`power_mean_reference`) all from those two parameters. Returns the loss."""
    loss = functools.partial(power_mean_variant, p=p, epsilon=epsilon)
    reference = functools.partial(power_mean_reference, epsilon=epsilon, p=p)
    return register(name, label=label, bounds=(epsilon, epsilon), reference=reference)(loss)


#: HMPO (an ablation of the GMPO paper's own repository): the harmonic mean
hmpo = register_power(
    "hmpo", "HMPO: harmonic mean (p = -1) of the clipped ratios, log-ratio clip ± 0.4", p=-1.0
)
#: between GMPO (p = 0) and GRPO (p = 1)
pmpo_half = register_power(
    "pmpo_0.5", "power mean p = 0.5 of the clipped ratios, log-ratio clip ± 0.4", p=0.5
)
#: the arithmetic mean, ``grpo_wide``'s loss
pmpo_one = register_power(
    "pmpo_1", "power mean p = 1 of the clipped ratios (GRPO, ratio clip (e^-0.4, e^0.4))", p=1.0
)


__all__ = [
    "hmpo",
    "pmpo_half",
    "pmpo_one",
    "power_mean_loss",
    "power_mean_reference",
    "power_mean_variant",
    "register_power",
]
