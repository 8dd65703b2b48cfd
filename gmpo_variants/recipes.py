"""The two helpers every recipe of docs/recipes.md starts from (they hold the masking
convention), and their float64 counterparts for the variants' references.

The page shows :func:`masked_log_ratio` and :func:`policy_loss` letter for letter
(``tests/variants/test_registry.py`` compares them); the ``reference_*`` functions are NumPy,
float64, written from the formulas and never calling the torch code.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from torch import Tensor

from gmpo_core import reference


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


Arrays = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_], NDArray[np.float64]]


def reference_inputs(
    logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike, mask: ArrayLike
) -> Arrays:
    """``(r, advantages, valid, n)`` in float64: the log-ratio (0 at invalid positions), the
    advantages, the valid tokens and their count per row.

    Shape:
        logp, old_logp, mask: (B, T); advantages: (B,). Output: (B, T), (B,), (B, T), (B,).
    """
    lp, olp, adv, valid = reference.check_inputs(logp, old_logp, advantages, mask)
    return reference.masked_log_ratio(lp, olp, valid), adv, valid, valid.sum(axis=1) * 1.0


def reference_policy_loss(
    advantages: NDArray[np.float64], log_coef: NDArray[np.float64], n: NDArray[np.float64]
) -> float:
    """mean_i of -A_i·exp(log_coef_i), exactly 0 for rows with A_i = 0 or n_i = 0.

    Shape:
        advantages, log_coef, n: (B,). Output: a float.
    """
    active = (advantages != 0) & (n > 0)
    with np.errstate(over="ignore", invalid="ignore"):
        row = -advantages * np.exp(np.where(active, log_coef, 0.0))
    return float(np.mean(np.where(active, row, 0.0)))
