"""Independent float64 NumPy reference of the GMPO loss contract (docs/semantics.md).

Written from docs/semantics.md and the paper (Geometric-Mean Policy Optimization, arXiv
2507.20673, Eq. 4) only. It never imports the torch implementation of this package, so the torch
code can be tested against it. Everything is computed in float64; values at invalid positions are
removed with ``np.where`` before any arithmetic, so NaN or ±inf there never matter.

Paper objective (Eq. 4), per row i with advantage A_i and token ratios ρ_t = exp(r_t):

    J_i = { Π_t | min(ρ_t·A_i, clip(ρ_t, e^-ε_l, e^ε_h)·A_i) | }^{1/|o_i|} · sgn(A_i)
        = A_i · exp( Σ_t c_t / n_i )

with the one-sided log-space trust region c_t = min(r_t, ε_h) for A_i ≥ 0 and
c_t = max(r_t, −ε_l) for A_i < 0. The loss is −J, averaged over the B rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from gmpo_core.options import EPSILON, upper

Float64Array = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class ReferenceResult:
    """Output of :func:`gmpo_loss`.

    Shape:
        per_sequence_loss: (B,); log_coef: (B,); grad_logp: (B, T);
        stats["row_clip_low"], stats["row_clip_high"]: (B,); every other value is a float.
    """

    loss: float
    per_sequence_loss: Float64Array
    log_coef: Float64Array
    grad_logp: Float64Array
    metrics: dict[str, float]
    stats: dict[str, float | Float64Array]


# --------------------------------------------------------------------------- validation


def _as_float64(x: ArrayLike, name: str) -> Float64Array:
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a real (bool, int or float) array, got dtype {a.dtype}")
    return a.astype(np.float64)


def check_epsilons(epsilon: float, epsilon_high: float | None) -> tuple[float, float]:
    """``(epsilon, epsilon_high)`` as floats, ``epsilon_high`` None meaning ``epsilon``; each
    finite and > 0."""
    eps_h = upper(epsilon, epsilon_high)
    for name, value in (("epsilon", epsilon), ("epsilon_high", eps_h)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be finite and > 0, got {value}")
    return float(epsilon), float(eps_h)


def check_inputs(
    logp: ArrayLike, old_logp: ArrayLike | None, advantages: ArrayLike, mask: ArrayLike
) -> tuple[Float64Array, Float64Array, Float64Array, BoolArray]:
    """Convert and shape-check the four main inputs.

    Shape:
        logp, old_logp, mask: (B, T); advantages: (B,). Returns (logp, old_logp, adv, valid).
    """
    lp = _as_float64(logp, "logp")
    if lp.ndim != 2:
        raise ValueError(f"logp must have shape (B, T), got {lp.shape}")
    olp = lp if old_logp is None else _as_float64(old_logp, "old_logp")
    valid = _as_float64(mask, "mask") != 0
    adv = _as_float64(advantages, "advantages")
    for name, arr in (("old_logp", olp), ("mask", valid)):
        if arr.shape != lp.shape:
            raise ValueError(f"{name} must have the shape of logp {lp.shape}, got {arr.shape}")
    if adv.shape != lp.shape[:1]:
        raise ValueError(f"advantages must have shape ({lp.shape[0]},), got {adv.shape}")
    return lp, olp, adv, valid


def masked_log_ratio(lp: Float64Array, olp: Float64Array, valid: BoolArray) -> Float64Array:
    """r = logp − old_logp at valid positions, 0 elsewhere (selected before subtracting).

    Shape:
        lp, olp, valid: (B, T) -> (B, T).
    """
    with np.errstate(invalid="ignore", over="ignore"):  # inf − inf in A = 0 rows is allowed
        return np.where(valid, lp, 0.0) - np.where(valid, olp, 0.0)


def trust_region(
    r: Float64Array, adv: Float64Array, eps_l: float, eps_h: float, dual_clip: float | None
) -> tuple[Float64Array, BoolArray, BoolArray, BoolArray]:
    """Per-token one-sided log-space clip (docs/semantics.md S1) and where each bound took effect.

    c_t = min(r_t, ε_h) if A ≥ 0; max(r_t, −ε_l) if A < 0; with dual clip, for A < 0 also
    min(c_t, log c). Clipped is strict: a token exactly on a bound is not clipped.

    Shape:
        r: (B, T); adv: (B,) -> c, clipped_low, clipped_high, clipped_dual: (B, T) each.
        clipped_high includes A = 0 rows (they use the upper bound); metrics exclude them.
    """
    neg = (adv < 0)[:, None]  # (B, 1)
    c = np.where(neg, np.maximum(r, -eps_l), np.minimum(r, eps_h))
    clipped_low = neg & (r < -eps_l)
    clipped_high = ~neg & (r > eps_h)
    clipped_dual = np.zeros_like(clipped_low)
    if dual_clip is not None:
        log_c = math.log(dual_clip)
        c = np.where(neg, np.minimum(c, log_c), c)
        clipped_dual = neg & (r > log_c)
    return c, clipped_low, clipped_high, clipped_dual


# --------------------------------------------------------------------------- GMPO loss


def gmpo_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    epsilon: float = EPSILON,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logp: ArrayLike | None = None,
    is_weights: ArrayLike | None = None,
    dual_clip: float | None = None,
    cu_seqlens: ArrayLike | None = None,
) -> ReferenceResult:
    """GMPO loss (paper Eq. 4, docs/semantics.md), its closed-form gradient, stats and metrics.

    per_sequence_loss_i = −A_i · exp(log_coef_i) · w_i + β · KL_i,
    log_coef_i = Σ_t valid·c_t / max(n_i, 1),
    KL_i = Σ_t valid·(expm1(d_t) − d_t) / max(n_i, 1),  d = ref_logp − logp,
    loss = mean_i per_sequence_loss_i (0 for an empty batch, B = 0).
    The policy term is exactly 0 where A_i = 0 or n_i = 0.

    d loss / d logp_t = (1/B)·[−A_i·w_i·exp(log_coef_i)/n_i · u_t + β/n_i·(1 − exp(d_t))]
    at valid tokens (u_t = 0 where the clip took effect, else 1), and 0 elsewhere.

    Packed input (``cu_seqlens`` given, S + 1 boundaries from 0 to N, non-decreasing): row i is
    the tokens ``cu_seqlens[i]:cu_seqlens[i + 1]``, and the result is, by definition, that of
    the padded rows (``grad_logp`` back at the packed positions).

    Shape:
        logp, old_logp, mask, ref_logp: (B, T); advantages: (B,);
        is_weights: (B,), (B, 1) (row weights) or (B, T) (token weights; 0 removes the token).
        Packed: logp, old_logp, mask, ref_logp: (N,); advantages: (S,); is_weights: (N,)
        (token weights) or (S, 1) (row weights); grad_logp: (N,).
    """
    if cu_seqlens is not None:
        rows, cols = _segment_positions(cu_seqlens, np.shape(logp), np.shape(advantages))
        # at least 2 columns, so that padded (S, T) token weights never read as (S, 1) row ones
        length = max(int(cols.max(initial=-1)) + 1, 2)
        n_rows = len(np.asarray(cu_seqlens)) - 1

        def pad(x: ArrayLike, name: str) -> Float64Array:
            a = _as_float64(x, name)
            if a.shape != np.shape(logp):
                raise ValueError(
                    f"{name} must have the shape of logp {np.shape(logp)}, got {a.shape}"
                )
            out = np.zeros((n_rows, length))
            out[rows, cols] = a
            return out

        w = is_weights
        if w is not None and np.shape(w) != (n_rows, 1):
            w = pad(w, "is_weights")  # token weights; (S, 1) are row weights
        result = gmpo_loss(
            pad(logp, "logp"), None if old_logp is None else pad(old_logp, "old_logp"),
            advantages, pad(mask, "mask"), epsilon=epsilon, epsilon_high=epsilon_high,
            beta=beta, ref_logp=None if ref_logp is None else pad(ref_logp, "ref_logp"),
            is_weights=w, dual_clip=dual_clip,
        )  # fmt: skip
        grad = result.grad_logp[rows, cols]  # (N,)
        return ReferenceResult(
            result.loss, result.per_sequence_loss, result.log_coef, grad, result.metrics,
            result.stats,
        )  # fmt: skip
    eps_l, eps_h = check_epsilons(epsilon, epsilon_high)
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    lp, olp, adv, valid = check_inputs(logp, old_logp, advantages, mask)
    batch, length = lp.shape

    ref = None if ref_logp is None else _as_float64(ref_logp, "ref_logp")
    if ref is not None and ref.shape != lp.shape:
        raise ValueError(f"ref_logp must have the shape of logp {lp.shape}, got {ref.shape}")
    if beta != 0 and ref is None:
        raise ValueError("ref_logp is required when beta != 0")

    token_w = None
    row_w = np.ones(batch)  # (B,)
    if is_weights is not None:
        isw = _as_float64(is_weights, "is_weights")
        if isw.shape in ((batch,), (batch, 1)):  # (B, 1) is a row weight, even when T == 1
            row_w = isw.reshape(batch)
        elif isw.shape == (batch, length):
            token_w = isw
            valid = valid & (isw != 0)  # a zero-weight token is removed from the row
        else:
            raise ValueError(
                f"is_weights must have shape ({batch},), ({batch}, 1) or {lp.shape}, "
                f"got {isw.shape}"
            )

    n = valid.sum(axis=1).astype(np.float64)  # (B,)
    n1 = np.maximum(n, 1.0)  # (B,)
    active = (adv != 0) & (n > 0)  # (B,) rows that carry a policy term
    r = masked_log_ratio(lp, olp, valid)  # (B, T)
    c, clipped_low, clipped_high, clipped_dual = trust_region(r, adv, eps_l, eps_h, dual_clip)

    with np.errstate(invalid="ignore", over="ignore"):
        log_coef = np.where(valid, c, 0.0).sum(axis=1) / n1  # (B,)
        if token_w is not None:  # geometric mean of the token weights over valid tokens
            row_w = np.exp(np.log(np.where(valid, token_w, 1.0)).sum(axis=1) / n1)  # (B,)
        coef = np.exp(log_coef) * row_w  # (B,)
        per_sequence_loss = np.where(active, -adv * coef, 0.0)  # (B,) policy term
        unclipped = valid & ~(clipped_low | clipped_high | clipped_dual)  # (B, T)
        grad = np.where(active[:, None] & unclipped, (-adv * coef / n1)[:, None], 0.0)  # (B, T)
        kl_sum = None
        if ref is not None and beta != 0:
            d = np.where(valid, ref, 0.0) - np.where(valid, lp, 0.0)  # (B, T)
            k = np.where(valid, np.expm1(d) - d, 0.0)  # (B, T) k3 estimator
            kl_sum = float(k.sum())
            per_sequence_loss = per_sequence_loss + beta * k.sum(axis=1) / n1
            grad = grad + np.where(valid, -np.expm1(d), 0.0) * (beta / n1)[:, None]
        grad = grad / batch

    low_rows = (valid & clipped_low).sum(axis=1)  # (B,)
    high_rows = (valid & clipped_high & (adv > 0)[:, None]).sum(axis=1)  # (B,) A = 0 excluded
    row_clip_low, row_clip_high = low_rows / n1, high_rows / n1  # (B,)
    num_tokens = float(n.sum())
    r_min = float(np.min(np.where(valid, r, np.inf), initial=np.inf))  # +inf without tokens
    r_max = float(np.max(np.where(valid, r, -np.inf), initial=-np.inf))  # -inf without tokens
    num_dual = float((valid & clipped_dual).sum())
    stats: dict[str, float | Float64Array] = {
        "num_tokens": num_tokens,
        "num_clipped_low": float(low_rows.sum()),
        "num_clipped_high": float(high_rows.sum()),
        "num_clipped_dual": num_dual,
        "row_clip_low": row_clip_low,
        "row_clip_high": row_clip_high,
        "log_ratio_min": r_min,
        "log_ratio_max": r_max,
    }

    tokens1 = max(num_tokens, 1.0)
    low_mean = float(low_rows.sum()) / tokens1
    high_mean = float(high_rows.sum()) / tokens1
    nonempty = n > 0  # (B,)
    any_rows, any_tokens = bool(nonempty.any()), num_tokens > 0
    metrics: dict[str, float] = {
        "clip_ratio/low_mean": low_mean,
        "clip_ratio/high_mean": high_mean,
        "clip_ratio/region_mean": low_mean + high_mean,
        "clip_ratio/low_min": float(row_clip_low[nonempty].min()) if any_rows else math.nan,
        "clip_ratio/high_max": float(row_clip_high[nonempty].max()) if any_rows else math.nan,
        "log_ratio/min": r_min if any_tokens else math.nan,
        "log_ratio/max": r_max if any_tokens else math.nan,
    }
    if kl_sum is not None:
        stats["kl_sum"] = kl_sum
        metrics["kl"] = kl_sum / tokens1
    if dual_clip is not None:
        metrics["clip_ratio/dual_mean"] = num_dual / tokens1

    return ReferenceResult(
        loss=float(per_sequence_loss.sum() / max(len(per_sequence_loss), 1)),  # 0 when B = 0
        per_sequence_loss=per_sequence_loss,
        log_coef=log_coef,
        grad_logp=grad,
        metrics=metrics,
        stats=stats,
    )


def _segment_positions(
    cu_seqlens: ArrayLike, token_shape: tuple[int, ...], adv_shape: tuple[int, ...]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The padded (row, column) of each packed token. Shape: -> (N,), (N,)."""
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.dtype.kind not in "iu" or len(token_shape) != 1:
        raise ValueError("cu_seqlens must be a 1-D integer array, with 1-D (N,) token arrays")
    if adv_shape != (len(cu) - 1,):
        raise ValueError(f"advantages must have shape ({len(cu) - 1},), got {adv_shape}")
    if cu[0] != 0 or cu[-1] != token_shape[0] or np.any(np.diff(cu) < 0):
        raise ValueError("cu_seqlens must start at 0, end at N and be non-decreasing")
    lengths = np.diff(cu).astype(np.int64)
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    cols = np.arange(token_shape[0], dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lengths)
    return rows, cols


# --------------------------------------------------------------------------- power means


@dataclass(frozen=True)
class PowerMeanResult:
    """Output of :func:`masked_power_mean`.

    Shape:
        value: (B,); grad: (B, T).
    """

    value: Float64Array
    grad: Float64Array


# below this |p|·max|x − mean|, the cumulant series (its next term is under 1e-13·max|x − mean|)
_CUMULANT_SERIES_BELOW = 1e-3


def masked_power_mean(log_values: ArrayLike, mask: ArrayLike, p: float) -> PowerMeanResult:
    """Log of the power mean of exp(x) over each row's valid positions (docs/semantics.md S17)
    and its gradient.

    value_i = (1/p)·log( Σ_t valid·exp(p·x_t) / n_i ) for p ≠ 0, Σ_t valid·x_t / n_i at p = 0,
    0 for an empty row. With μ the row's mean and d_t = x_t − μ it is computed as

    - μ + p·κ₂/2 + p²·κ₃/6 + p³·κ₄/24 where |p|·max|d| ≤ 1e-3: the cumulant series of
      log mean exp(p·d) (κ₂ = m₂, κ₃ = m₃, κ₄ = m₄ − 3m₂², m_k the central moments), divided
      by p; it converges for |p|·max|d| < π/2;
    - μ + (max(p·d) + log mean exp(p·d − max(p·d))) / p elsewhere.

    grad_t = ∂value_i/∂x_t = exp(p·x_t) / Σ_s valid·exp(p·x_s) at valid tokens (1/n_i at p = 0),
    0 elsewhere.

    Shape:
        log_values, mask: (B, T) -> value (B,), grad (B, T).
    """
    x = _as_float64(log_values, "log_values")
    if x.ndim != 2:
        raise ValueError(f"log_values must have shape (B, T), got {x.shape}")
    valid = _as_float64(mask, "mask") != 0
    if valid.shape != x.shape:
        raise ValueError(f"mask must have the shape of log_values {x.shape}, got {valid.shape}")
    p = float(p)
    if not math.isfinite(p):
        raise ValueError(f"p must be finite, got {p}")
    x = np.where(valid, x, 0.0)  # masked values never enter the arithmetic
    value = np.zeros(x.shape[0])
    grad = np.zeros(x.shape)
    for i in range(x.shape[0]):
        v = x[i][valid[i]]
        if v.size == 0:
            continue
        mu = math.fsum(v) / v.size
        d = v - mu
        z = p * d
        w = np.exp(z - z.max())
        grad[i][valid[i]] = w / w.sum()
        if p == 0:
            value[i] = mu
        elif abs(p) * np.abs(d).max() <= _CUMULANT_SERIES_BELOW:
            m2, m3, m4 = (float(np.mean(d**k)) for k in (2, 3, 4))
            value[i] = mu + p * m2 / 2 + p**2 * m3 / 6 + p**3 * (m4 - 3 * m2**2) / 24
        else:
            value[i] = mu + (z.max() + math.log(float(np.mean(np.exp(z - z.max()))))) / p
    return PowerMeanResult(value, grad)
