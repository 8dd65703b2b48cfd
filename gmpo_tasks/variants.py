"""The loss variants, each a few lines on ``gmpo_core``'s public API: docs/recipes.md's recipes
(the page shows this module's functions; ``tests/tasks/test_recipes.py`` runs the page's blocks
and checks each against this module's source), and the stability study's methods over them.

A recipe maps ``(logp, old_logp, advantages, mask, epsilon, epsilon_high)`` -- (B, T), (B, T),
(B,), (B, T) -- to the loss (0-d). A *method* (:data:`METHODS`, by name: what ``python -m
studies.stability --methods`` takes) maps ``(logp, old_logp, advantages, mask)`` to the loss and
the fraction of valid tokens whose gradient the clip removed (0-d, detached). To study a variant,
write such a function and add it to :data:`METHODS`; e.g. GMPO with an asymmetric clip range::

    METHODS["gmpo_asym"] = Method(
        "GMPO, log-ratio clip (-0.2, 0.4)",
        lambda lp, old, a, m: gmpo_method(lp, old, a, m, epsilon=0.2, epsilon_high=0.4),
    )
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gmpo_core import (
    clip_log_ratio,
    clip_metrics,
    gmpo_loss,
    masked_geometric_mean,
    trust_region_log_ratio,
)

LossFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class Method(NamedTuple):
    """A study method: its label, its loss, and where it has a token-level clip its bounds in log
    space, ``(low, high)`` (the clip acts below ``-low`` with A < 0 and above ``high`` with A > 0;
    the study's clipped fraction by side)."""

    label: str
    loss: LossFn
    bounds: tuple[float, float] | None = None


# docs/recipes.md's recipes, in the page's order ------------------------------------------------


def masked_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """r = logp - old_logp at valid positions, exactly 0 elsewhere; and the mask as bool.

    Shape:
        logp, old_logp, mask: (B, T). Output: r (B, T), valid (B, T).
    """
    valid = mask != 0
    return torch.where(valid, logp - old_logp, 0), valid


def policy_loss(advantages: Tensor, log_coef: Tensor, valid: Tensor) -> Tensor:
    """mean_i of -A_i * exp(log_coef_i): Eq. 4 once the per-row log-coefficient is known.

    A row with A_i = 0 or no valid token gives exactly 0: exp() sees 0 there, so a huge or NaN
    log_coef can neither overflow nor reach the gradient.

    Shape:
        advantages, log_coef: (B,). valid: (B, T). Output: ().
    """
    active = (advantages != 0) & valid.any(-1)  # (B,)
    per_row = -advantages * torch.exp(torch.where(active, log_coef, 0))  # (B,)
    return torch.where(active, per_row, 0).mean()


def gmpo_from_blocks(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.4, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """GMPO (paper Eq. 4): per-token log-space clip, then the geometric mean of the ratios."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    c = trust_region_log_ratio(r, advantages, epsilon=epsilon, epsilon_high=epsilon_high)  # (B, T)
    log_coef = masked_geometric_mean(c, valid)  # (B,) sum_t c_t / |o_i|
    return policy_loss(advantages, log_coef, valid)


def sequence_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.4, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """Ablation: clip the sequence's mean log-ratio instead of each token's."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    s = masked_geometric_mean(r, valid)  # (B,) unclipped mean log-ratio
    log_coef = trust_region_log_ratio(s, advantages, epsilon=epsilon, epsilon_high=epsilon_high)
    return policy_loss(advantages, log_coef, valid)  # log_coef: (B,)


def no_length_norm_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.4, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """Ablation: the product of the clipped token ratios, without the 1/|o| root."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    c = trust_region_log_ratio(r, advantages, epsilon=epsilon, epsilon_high=epsilon_high)  # (B, T)
    log_coef = torch.where(valid, c, 0).sum(-1)  # (B,) sum, not mean
    return policy_loss(advantages, log_coef, valid)


def no_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.4, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """Ablation: the geometric mean of the unclipped ratios (epsilon is ignored)."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    return policy_loss(advantages, masked_geometric_mean(r, valid), valid)


def grpo_arithmetic_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.2, epsilon_high: float | None = None) -> Tensor:  # fmt: skip
    """GRPO: arithmetic token mean of PPO's clipped ratio objective, clip in ratio space."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    a = advantages[:, None]  # (B, 1)
    valid = (mask != 0) & (a != 0)  # (B, T)
    rho = torch.exp(torch.where(valid, logp - old_logp, 0))  # (B, T)
    objective = torch.minimum(rho * a, rho.clamp(1 - epsilon, 1 + eps_high) * a)  # (B, T)
    per_row = torch.where(valid, objective, 0).sum(-1) / valid.sum(-1).clamp(min=1)  # (B,)
    return -per_row.mean()


def asymmetric_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.4, epsilon_high: float | None = 0.6, *, impl: str = "plain") -> Tensor:  # fmt: skip
    """GMPO with the clip range (e^-epsilon, e^epsilon_high)."""
    out = gmpo_loss(
        logp, old_logp, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high, impl=impl
    )
    return out.loss


def asymmetric_clip_from_blocks(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
    epsilon: float = 0.4, epsilon_high: float | None = 0.6) -> Tensor:  # fmt: skip
    """GMPO with an asymmetric clip range, through PPO's min/max form of the trust region."""
    r, valid = masked_log_ratio(logp, old_logp, mask)  # (B, T)
    clipped = clip_log_ratio(r, epsilon=epsilon, epsilon_high=epsilon_high)  # (B, T)
    positive = (advantages >= 0)[:, None]  # (B, 1)
    c = torch.where(positive, torch.minimum(r, clipped), torch.maximum(r, clipped))  # (B, T)
    return policy_loss(advantages, masked_geometric_mean(c, valid), valid)


# the stability study's methods: (loss, clipped fraction) ------------------------------------


def clipped_fraction(
    r: Tensor, advantages: Tensor, mask: Tensor, epsilon: float, epsilon_high: float
) -> Tensor:
    """Fraction of valid tokens the one-sided clip (log-space bounds) zeroes the gradient of."""
    stats = clip_metrics(r, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high)
    clipped = stats.num_clipped_low + stats.num_clipped_high
    return (clipped / stats.num_tokens.clamp(min=1)).float()


def grpo_method(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """TRL's ``loss_type="grpo"`` (no KL, no ``delta``): :func:`grpo_arithmetic_loss`, PPO's
    clipped surrogate per token in ratio space, a token mean per row, then the mean over rows.
    ``tests/trl/test_variants_grpo.py`` checks it against TRL's loss step."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    loss = grpo_arithmetic_loss(logp, old_logp, advantages, mask, epsilon, eps_high)
    low, high = -math.log(1 - epsilon), math.log1p(eps_high)  # the same bounds in log space
    return loss, clipped_fraction(logp - old_logp, advantages, mask, low, high)


def gmpo_method(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, **clip: Any
) -> tuple[Tensor, Tensor]:
    """GMPO (``gmpo_core.gmpo_loss``, whose keyword arguments ``clip`` are: ``epsilon`` 0.4 by
    default, ``epsilon_high``): token clip in log space, then the geometric mean."""
    out = gmpo_loss(logp, old_logp, advantages, mask, **clip)
    return out.loss, out.metrics["clip_ratio/region_mean"].float()


def gmpo_noclip_method(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`no_clip_loss`, the geometric mean of the unclipped ratios (the paper's no-clip
    ablation); nothing is clipped."""
    return no_clip_loss(logp, old_logp, advantages, mask), logp.new_zeros(())


def gmpo_seqclip_method(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, epsilon: float = 0.4
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


WIDE = 0.4  # GMPO's log-space epsilon, and grpo_wide's ratio range (e^-0.4, e^0.4)

#: grpo's ratio clip 1 +- 0.2 in log space
GRPO_BOUNDS = (-math.log(1 - 0.2), math.log1p(0.2))

METHODS: dict[str, Method] = {
    "grpo": Method("GRPO, ratio clip 1 ± 0.2", grpo_method, GRPO_BOUNDS),
    "grpo_wide": Method(
        "GRPO, ratio clip (e^-0.4, e^0.4)",
        lambda lp, old, a, m: grpo_method(
            lp, old, a, m, epsilon=-math.expm1(-WIDE), epsilon_high=math.expm1(WIDE)
        ),
        (WIDE, WIDE),
    ),
    "gmpo": Method("GMPO, log-ratio clip ± 0.4", gmpo_method, (0.4, 0.4)),
    "gmpo_narrow": Method(
        "GMPO, log-ratio clip ± 0.2",
        lambda lp, old, a, m: gmpo_method(lp, old, a, m, epsilon=0.2),
        (0.2, 0.2),
    ),
    "gmpo_noclip": Method("GMPO without clip", gmpo_noclip_method),
    "gmpo_seqclip": Method("GMPO, sequence-level clip ± 0.4", gmpo_seqclip_method),
}


def resolve(name: str) -> Method:
    """The method called ``name``: an entry of :data:`METHODS`, or ``module:function`` (an
    importable module's :class:`Method`, or its function with a method's signature
    ``(logp, old_logp, advantages, mask) -> (loss, clipped fraction)``: no token clip bounds,
    so its clipped fraction by side is NaN). A ValueError says what is wrong."""
    if name in METHODS:
        return METHODS[name]
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown method {name!r}: choose from {list(METHODS)} or module:function")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"method {name!r}: {err}") from err
    if isinstance(obj, Method):
        return obj
    if not callable(obj):
        raise ValueError(f"method {name!r} is neither a Method nor a function")
    return Method(name, obj)
