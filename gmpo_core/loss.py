"""``gmpo_loss``: the GMPO objective composed from the building blocks in :mod:`gmpo_core.ops`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from gmpo_core import _checks
from gmpo_core.ops import (
    Bound,
    ClipStats,
    ClipStatsTuple,
    _clip_stats,
    _count,
    _k3,
    _masked_mean,
    _trust_region,
    _valid,
    metric_vector,
    metrics_dict,
)

Impl = Literal["auto", "compiled", "eager"]


@dataclass(frozen=True)
class GMPOOutput:
    """What :func:`gmpo_loss` returns.

    Shape:
        loss: (), float32 (float64 for float64 inputs). per_sequence_loss: (B,). log_coef: (B,).
        stats: per-call sums and extrema (see :class:`ClipStats`). kl_sum: () or None.
    """

    loss: Tensor
    per_sequence_loss: Tensor
    log_coef: Tensor
    stats: ClipStats
    kl_sum: Tensor | None  # sum of the k3 estimator over valid tokens; None when beta == 0
    metric_vector: Tensor | None = None  # (9,) in METRIC_KEYS order, when the path computed it

    @functools.cached_property
    def metrics(self) -> Mapping[str, Tensor]:
        """Local metrics of DESIGN §6 as 0-d detached tensors (computed on first access)."""
        vector = self.metric_vector
        if vector is None:
            vector = metric_vector(self.stats.as_tuple(), self.kl_sum)
        return metrics_dict(
            vector, self.stats.num_clipped_dual is not None, self.kl_sum is not None
        )


def _terms(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    valid: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    w_row: Tensor | None,
    eps_low: Bound,
    eps_high: Bound,
    log_dual: Bound | None,
    beta: Bound,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Eq. 4 per row, differentiable in ``logp``; shared by the eager and the fused path.

    Returns ``(per_sequence_loss, log_coef, policy, r, n, kl_rows)`` where ``policy`` is the
    row's policy term (also its derivative with respect to ``log_coef``), ``r`` the log-ratio
    (0 at invalid positions), ``n`` the valid-token count and ``kl_rows`` the per-row sum of k3.
    All inputs are already in the compute dtype.
    """
    r = torch.where(valid, logp - old_logp, 0)  # (B, T)
    c = _trust_region(r, adv, eps_low, eps_high, log_dual)  # (B, T)
    n = _count(valid, r)  # (B,) float
    # c is exactly 0 at invalid positions (r is 0 there, and every row's bounds straddle 0), so
    # the masked mean of c is its plain row sum over n: one mask select less per token
    log_coef = c.sum(-1) / n.clamp(min=1).to(c.dtype)  # (B,)
    # A = 0 and empty rows: policy term exactly 0, and no NaN can reach the gradient.
    active = (adv != 0) & (n > 0)  # (B,)
    log_w = log_coef if w_tok is None else log_coef + _masked_mean(torch.log(w_tok), valid, n)
    policy = -adv * torch.exp(torch.where(active, log_w, 0))  # (B,)
    if w_row is not None:
        policy = policy * w_row
    policy = torch.where(active, policy, 0)
    if ref_logp is None:
        return policy, log_coef, policy, r, n, None
    kl_rows = _k3(logp, ref_logp, valid).sum(-1)  # (B,)
    per_sequence_loss = policy + beta * kl_rows / n.clamp(min=1).to(kl_rows.dtype)
    return per_sequence_loss, log_coef, policy, r, n, kl_rows


def _cast(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    return None if t is None else t.to(dtype)


def compute(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    w_row: Tensor | None,
    eps_low: Bound,
    eps_high: Bound,
    log_dual: Bound | None,
    beta: Bound,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor, Tensor, ClipStatsTuple, Tensor | None]:
    """Everything per row, from the inputs in their own dtypes: both paths call this (the fused
    one inside its compiled forward kernel). Returns ``(per_sequence_loss, log_coef, policy, n,
    clip statistics, kl_rows)``; only the first two carry gradients."""
    adv = advantages.to(dtype)
    valid = _valid(mask, w_tok)
    per_seq, log_coef, policy, r, n, kl_rows = _terms(
        logp.to(dtype), old_logp.to(dtype), adv, valid, _cast(ref_logp, dtype),
        _cast(w_tok, dtype), _cast(w_row, dtype), eps_low, eps_high, log_dual, beta,
    )  # fmt: skip
    stats = _clip_stats(r.detach(), adv, valid, n, eps_low, eps_high, log_dual)
    return per_seq, log_coef, policy.detach(), n, stats, kl_rows


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float32/bf16/fp16 inputs (DESIGN §5.8); float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def gmpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = 0.4,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    is_weights: Tensor | None = None,
    dual_clip: float | None = None,
    impl: Impl = "auto",
    check_values: bool = False,
) -> GMPOOutput:
    """Geometric-Mean Policy Optimization loss (arXiv 2507.20673, Eq. 4), to minimize.

    Per row i, with ``r = logp - old_logp`` and ``n_i`` valid tokens::

        c_t        = min(r_t, eps_h) if A_i >= 0 else max(r_t, -eps_l)     (trust region, log space)
        log_coef_i = sum_t c_t / max(n_i, 1)                              (log geometric mean)
        loss_i     = -A_i * exp(log_coef_i) * w_i + beta * KL_i           (KL: token-mean k3)
        loss       = mean_i loss_i

    Empty rows and ``A_i = 0`` rows contribute exactly 0 to the policy term and its gradient;
    values at masked positions never matter. ``old_logp``, ``advantages``, ``ref_logp`` and
    ``is_weights`` are constants (no gradient flows to them). See DESIGN.md §5 for every rule.

    Args:
        logp: log-probs of the sampled tokens under the current policy.
        old_logp: behaviour-policy log-probs; None means ``logp.detach()`` (on-policy).
        advantages: one advantage per sequence.
        mask: valid completion tokens (bool or 0/1).
        epsilon: log-space lower clip; the ratio lower bound is ``exp(-epsilon)``.
        epsilon_high: log-space upper clip; None means ``epsilon``.
        beta: weight of the sequence-level KL to the reference policy (needs ``ref_logp``).
        ref_logp: reference-policy log-probs.
        is_weights: rollout-correction weights. (B,) or (B, 1) multiply the row's policy term;
            (B, T) enter as their geometric mean over the row's valid tokens, and a token whose
            weight is 0 is removed from the row. (With T = 1, (B, 1) is read as a row weight.)
        dual_clip: optional cap ``c > 1`` on the ratio of negative-advantage tokens.
        impl: ``"auto"`` (the fused, compiled path where ``torch.compile`` works, else the fused
            path run eagerly, with one warning), ``"compiled"`` (the fused, compiled path or an
            error) or ``"eager"`` (the building blocks under plain autograd). Inside a user's
            ``torch.compile`` every ``impl`` traces the building blocks into the user's graph.
        check_values: also check values (mask is 0/1, finite log-probs at valid positions,
            non-negative weights). This synchronizes with the device.

    Shape:
        logp, old_logp, mask, ref_logp: (B, T). advantages: (B,). is_weights: (B,), (B, 1) or
        (B, T). Output: see :class:`GMPOOutput`.
    """
    eps_low, eps_high, log_dual = _checks.check_hyperparameters(epsilon, epsilon_high, dual_clip)
    beta = _checks.check_beta(beta, ref_logp)
    _checks.check_gmpo_inputs(logp, old_logp, advantages, mask, ref_logp, is_weights)
    if check_values:
        _checks.check_values(logp, old_logp, mask, ref_logp, is_weights)
    if impl not in ("auto", "compiled", "eager"):
        raise ValueError(f"impl must be 'auto', 'compiled' or 'eager', got {impl!r}")

    old = logp.detach() if old_logp is None else old_logp.detach()
    ref = ref_logp.detach() if beta != 0 and ref_logp is not None else None
    w_tok = w_row = None
    if is_weights is not None:
        if is_weights.dim() == 2 and is_weights.shape[1] > 1:  # (B, T); (B, 1) is a row weight
            w_tok = is_weights.detach()
        else:
            w_row = is_weights.detach().reshape(-1)

    if impl == "eager" or torch.compiler.is_compiling():  # the user's compile fuses them
        return _eager(
            logp, old, advantages, mask, ref, w_tok, w_row, eps_low, eps_high, log_dual, beta
        )
    from gmpo_core import fused

    return fused.fused_gmpo(
        logp, old, advantages, mask, ref, w_tok, w_row, eps_low, eps_high, log_dual, beta,
        strict=impl == "compiled",
    )  # fmt: skip


def _eager(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    w_row: Tensor | None,
    eps_low: float,
    eps_high: float,
    log_dual: float | None,
    beta: float,
) -> GMPOOutput:
    """The building blocks under plain autograd: the readable path, and the one to debug with."""
    per_seq, log_coef, _, _, stats, kl_rows = compute(
        logp, old_logp, advantages, mask, ref_logp, w_tok, w_row,
        eps_low, eps_high, log_dual, beta, compute_dtype(logp.dtype),
    )  # fmt: skip
    kl_sum = None if kl_rows is None else kl_rows.detach().sum()
    return GMPOOutput(per_seq.mean(), per_seq, log_coef, ClipStats(*stats), kl_sum)
