"""The public building blocks of GMPO, each a pure function of tensors.

Everything is in log space: a ratio rho = exp(r) is handled through its log r = logp - old_logp.
Each function validates its arguments (shapes, dtypes, devices and numbers only: no device
synchronization) and calls the math layer (:mod:`gmpo_core._math`) that ``gmpo_loss`` runs too.
The rules are stated in docs/semantics.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gmpo_core import _checks, _counts, _math, _power, _rows
from gmpo_core.metrics import ClipStats
from gmpo_core.options import EPSILON, check_hyperparameters, check_power


def _hyper(epsilon: float, epsilon_high: float | None, dual_clip: float | None) -> _math.Hyper:
    return _checks.hyper(epsilon, epsilon_high, dual_clip, 0.0, None)


def _segments(
    cu_seqlens: Tensor | None, tokens: Tensor, name: str, segments: int | None = None
) -> _rows.Segments | None:
    """Packed rows: ``tokens`` (N,) and ``cu_seqlens`` (S + 1,), S = ``segments`` if given."""
    if cu_seqlens is None:
        return None
    if tokens.dim() != 1:
        raise ValueError(
            f"with cu_seqlens, {name} must have shape (N,) (packed), got shape "
            f"{tuple(tokens.shape)}"
        )
    rows = len(cu_seqlens) - 1 if segments is None else segments
    _checks.check_cu_seqlens(cu_seqlens, rows, tokens.shape[0])
    _checks.check_devices(name, tokens, {"cu_seqlens": cu_seqlens})
    return _rows.segments(cu_seqlens.detach(), tokens.shape[0])


def _log_ratio_rows(
    log_ratio: Tensor, advantages: Tensor, cu_seqlens: Tensor | None, others: dict[str, Tensor]
) -> _rows.Segments | None:
    """Check a log-ratio, its advantages and ``others`` (shapes, dtypes, devices); return the
    rows of packed input (None: padded)."""
    _checks.floating("log_ratio", log_ratio)
    if cu_seqlens is None:
        _checks.check_log_ratio_inputs(log_ratio, advantages)
    else:
        _checks.real("advantages", advantages)
    _checks.check_devices("log_ratio", log_ratio, {"advantages": advantages, **others})
    return _segments(cu_seqlens, log_ratio, "log_ratio", advantages.shape[0])


def clip_log_ratio(
    log_ratio: Tensor, *, epsilon: float = EPSILON, epsilon_high: float | None = None
) -> Tensor:
    """Two-sided clip of log-ratios to ``[-epsilon, epsilon_high]``: ``clip(rho, e^-eps, e^eps_h)``.

    This is the ``clip(.)`` inside the paper's Eq. 4 written in log space. A value exactly on a
    bound is not clipped: its gradient is 1 on every torch (:func:`torch.clamp` gives it 0
    with number bounds on torch 2.14.1; docs/semantics.md S1).

    Shape:
        log_ratio: any shape. Output: the same shape.
    """
    eps_low, eps_high, _ = check_hyperparameters(epsilon, epsilon_high)
    _checks.floating("log_ratio", log_ratio)
    low = torch.where(log_ratio < -eps_low, -eps_low, log_ratio)
    return torch.where(low > eps_high, eps_high, low)


def trust_region_log_ratio(
    log_ratio: Tensor,
    advantages: Tensor,
    *,
    epsilon: float = EPSILON,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """One-sided, sign-aware clip of log-ratios: PPO's trust region in log space.

    ``min(rho A, clip(rho, e^-eps_l, e^eps_h) A) = A * exp(c)`` with (docs/semantics.md S1)::

        c = min(r, eps_h)                 where A >= 0
        c = max(r, -eps_l)                where A <  0   (and min(c, log dual_clip) if given)

    A value exactly on a bound is not clipped: its gradient is 1 on every torch (docs/semantics.md
    S1). With ``dual_clip`` this equals GRPO's ``delta``
    (``clamp(ratio, max=delta)``) for negative advantages.

    Shape:
        log_ratio: (B, T) per token, or (B,) per sequence. advantages: (B,). Packed, with
        ``cu_seqlens`` (S + 1,): log_ratio (N,), advantages (S,). Output: the shape of
        ``log_ratio``.
    """
    h = _hyper(epsilon, epsilon_high, dual_clip)
    seg = _log_ratio_rows(log_ratio, advantages, cu_seqlens, {})
    return _math.trust_region(log_ratio, advantages.detach().to(log_ratio.dtype), h, seg)


def masked_geometric_mean(
    log_values: Tensor, mask: Tensor, *, cu_seqlens: Tensor | None = None
) -> Tensor:
    """Log of the geometric mean of ``exp(log_values)`` over each row's valid positions.

    ``log G_i = sum_t mask_t x_t / max(n_i, 1)`` with ``n_i = sum_t mask_t``: the ``1/|o_i|``
    root of Eq. 4, in log space (so it never overflows). An empty row gives 0 (G = 1). Values at
    masked positions never matter, NaN and inf included.

    Shape:
        log_values: (B, T). mask: (B, T) bool or 0/1. Output: (B,). Packed, with
        ``cu_seqlens`` (S + 1,): log_values and mask (N,), output (S,).
    """
    _checks.floating("log_values", log_values)
    _checks.check_devices("log_values", log_values, {"mask": mask})
    seg = _segments(cu_seqlens, log_values, "log_values")
    valid = _math.valid_tokens(_checks.check_mask(mask, log_values, "log_values"))
    n = _rows.row_sum(_math.as_float(valid, log_values.dtype), seg)
    return _math.masked_mean(log_values, valid, n, seg)


def masked_power_mean(
    log_values: Tensor, mask: Tensor, p: float, *, cu_seqlens: Tensor | None = None
) -> Tensor:
    """Log of the power mean of ``exp(log_values)`` over each row's valid positions.

    ``log M_p = (1/p) log(sum_t mask_t exp(p x_t) / n_i)`` for p != 0, and
    ``sum_t mask_t x_t / n_i`` (:func:`masked_geometric_mean`) at p = 0: p = 1 is the log of the
    arithmetic mean of the ratios, p -> 0 the geometric mean (GMPO), p = -1 the harmonic mean.
    Non-decreasing in p and continuous at p = 0, where its slope is half the row's variance of
    x. Computed without overflow at any p and without loss of digits near p = 0
    (docs/semantics.md S17). An empty row gives 0 (M = 1). Values at masked positions never
    matter, NaN and inf included; their gradient is 0.

    ``p`` is a real number (int, float, a NumPy scalar) with ``|p| <= 1e18``; a tensor ``p``
    is refused: it is a constant of the formula, whose branches (p = 0, its sign, tiny |p|)
    are chosen in Python, and checking a tensor's value would read it to the host. Under
    ``torch.compile`` a new p may recompile, and a NumPy scalar is a 0-d array whose value is
    unknown while tracing: pass ``float(p)`` there (S17).

    float32, bf16 and fp16 are computed in float32, float64 in float64 (S8); the result is in
    that dtype, and the gradient reaches ``log_values`` in its own dtype.

    Shape:
        log_values: (B, T). mask: (B, T) bool or 0/1. Output: (B,). Packed, with
        ``cu_seqlens`` (S + 1,): log_values and mask (N,), output (S,).
    """
    _checks.floating("log_values", log_values)
    exponent = check_power(p)
    dt = _math.compute_dtype(log_values.dtype)
    _checks.check_devices("log_values", log_values, {"mask": mask})
    seg = _segments(cu_seqlens, log_values, "log_values")
    valid = _math.valid_tokens(_checks.check_mask(mask, log_values, "log_values"))
    n = _rows.row_sum(_math.as_float(valid, dt), seg)
    return _power.log_power_mean(log_values.to(dt), valid, n, exponent, seg)


def sequence_kl(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, *, cu_seqlens: Tensor | None = None
) -> Tensor:
    """Per-sequence KL to the reference policy: token mean of the k3 estimator.

    ``KL_i = sum_t mask (expm1(d_t) - d_t) / max(n_i, 1)``, ``d = ref_logp - logp``. Written with
    ``expm1`` it is never negative, even in float32. Gradients flow to ``logp`` only.

    Shape:
        logp, ref_logp, mask: (B, T). Output: (B,). Packed, with ``cu_seqlens`` (S + 1,):
        logp, ref_logp and mask (N,), output (S,).
    """
    _checks.floating("logp", logp)
    _checks.floating("ref_logp", ref_logp)
    _checks.check_devices("logp", logp, {"ref_logp": ref_logp, "mask": mask})
    if ref_logp.shape != logp.shape:
        raise ValueError(
            f"ref_logp must have the shape of logp {tuple(logp.shape)}, got {tuple(ref_logp.shape)}"
        )
    seg = _segments(cu_seqlens, logp, "logp")
    valid = _math.valid_tokens(_checks.check_mask(mask, logp, "logp"))
    return _math.masked_mean(
        _math.k3(logp, ref_logp.detach(), valid)[0],
        valid,
        _rows.row_sum(_math.as_float(valid, logp.dtype), seg),
        seg,
    )


def clip_metrics(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = EPSILON,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
    cu_seqlens: Tensor | None = None,
) -> ClipStats:
    """Where the one-sided clip took effect, and the range of the unclipped log-ratio.

    A token counts as clipped low if ``A < 0`` and ``r < -eps_l``, high if ``A > 0`` and
    ``r > eps_h``, dual if ``A < 0`` and ``r > log dual_clip``: exactly the tokens whose gradient
    the trust region zeroes. Rows with ``A = 0`` are never clipped but their tokens count in the
    denominators (as in TRL and verl).

    Shape:
        log_ratio, mask: (B, T). advantages: (B,). Packed, with ``cu_seqlens`` (S + 1,):
        log_ratio and mask (N,), advantages (S,).
    """
    h = _hyper(epsilon, epsilon_high, dual_clip)
    seg = _log_ratio_rows(log_ratio, advantages, cu_seqlens, {"mask": mask})
    valid = _math.valid_tokens(_checks.check_mask(mask, log_ratio, "log_ratio"))
    r = torch.where(valid, log_ratio.detach(), 0)
    mf = _math.as_float(valid, r.dtype)
    adv = advantages.detach().to(r.dtype)
    sign, _, q, cq = _math.sign_space(r, adv, h, seg)
    dual = h.log_dual is not None
    cuts = _counts.clip_signs(r, q, cq, mf, seg, dual=dual)
    n = _rows.row_sum(mf, seg, exact=True)
    return _counts.clip_stats(cuts, sign, n, dual=dual)
