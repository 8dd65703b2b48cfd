"""The building blocks of GMPO, each a pure function of tensors.

Everything is in log space: a ratio rho = exp(r) is handled through its log r = logp - old_logp.
The public functions validate their arguments (shapes, dtypes and numbers only: no device
synchronization) and call the private kernels below, which :mod:`gmpo_core.loss` and the fused
path in :mod:`gmpo_core.fused` share. The kernels accept Python floats or 0-d tensors as bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from gmpo_core import _checks

Bound = float | Tensor
# the fields of ClipStats, in order (what a compiled kernel returns instead of the dataclass)
ClipStatsTuple = tuple[
    Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor, Tensor, Tensor, Tensor
]


# --------------------------------------------------------------------------------------------
# Kernels (no validation; shared by the eager and the fused path)
# --------------------------------------------------------------------------------------------


def _rows(values: Tensor, like: Tensor) -> Tensor:
    """Reshape per-row values (B,) to broadcast against ``like`` (B, ...)."""
    return values.reshape(values.shape + (1,) * (like.dim() - values.dim()))


def _row_bounds(
    adv: Tensor, eps_low: Bound, eps_high: Bound, log_dual: Bound | None
) -> tuple[Tensor, Tensor]:
    """Each row's one-sided trust region as bounds on r: ``[-inf, eps_h]`` where A >= 0,
    ``[-eps_l, log dual_clip or +inf]`` where A < 0. Shape: (B,) -> (B,), (B,)."""
    pos = adv >= 0
    inf = torch.full_like(adv, float("inf"))
    lo = torch.where(pos, -inf, -eps_low)
    hi = torch.where(pos, eps_high, inf if log_dual is None else log_dual)
    return lo, hi


def _trust_region(
    r: Tensor, adv: Tensor, eps_low: Bound, eps_high: Bound, log_dual: Bound | None
) -> Tensor:
    # one clamp between per-row bounds: a value on a bound keeps gradient 1, as with clamp
    lo, hi = _row_bounds(adv, eps_low, eps_high, log_dual)
    return r.clamp(min=_rows(lo, r), max=_rows(hi, r))


def _masked_mean(x: Tensor, valid: Tensor, n: Tensor) -> Tensor:
    """Sum of ``x`` over the valid positions of each row divided by max(n, 1)."""
    return torch.where(valid, x, 0).sum(-1) / n.clamp(min=1).to(x.dtype)


def _k3(logp: Tensor, ref_logp: Tensor, valid: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref), exactly 0 at invalid positions."""
    d = torch.where(valid, ref_logp - logp, 0)
    return torch.expm1(d) - d


def _count(cond: Tensor, like: Tensor) -> Tensor:
    """Per-row count of a (B, T) condition, as a float of ``like``'s dtype: exact below 2^24 per
    row, and float accumulators vectorize where int64 ones do not."""
    return cond.to(like.dtype).sum(-1)


def _clip_counts(
    r: Tensor, adv: Tensor, valid: Tensor, eps_low: Bound, eps_high: Bound, log_dual: Bound | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-row counts of tokens where the low, high and dual clip took effect."""
    lo, hi = _row_bounds(adv, eps_low, eps_high, log_dual)
    lo, hi = _rows(lo, r), _rows(hi, r)
    if log_dual is None:
        # without a dual clip a row can be clipped on one side only, the one its sign picks:
        # one count per row
        clipped = _count(valid & ((r < lo) | (r > hi)), r)  # (B,)
        return torch.where(adv < 0, clipped, 0), torch.where(adv > 0, clipped, 0), None
    below = _count(valid & (r < lo), r)  # (B,): A < 0 rows only (lo = -inf otherwise)
    above = _count(valid & (r > hi), r)  # (B,): eps_h where A >= 0, dual where A < 0
    return (
        torch.where(adv < 0, below, 0),
        torch.where(adv > 0, above, 0),
        torch.where(adv < 0, above, 0),
    )


def _valid(mask: Tensor, w_tok: Tensor | None) -> Tensor:
    """Valid tokens: mask != 0, minus tokens whose rollout weight is exactly 0 (DESIGN §5.7)."""
    if mask.dtype == torch.bool:
        valid = mask
    elif mask.dtype == torch.uint8:
        # the fused path hands bool masks over as uint8 views: compiled CPU code loads bool
        # tensors ~7x slower than uint8 ones, and compares floats faster than bytes
        valid = mask.to(torch.float32) != 0
    else:
        valid = mask != 0
    return valid if w_tok is None else valid & (w_tok != 0)


def _total(rows: Tensor) -> Tensor:
    """Exact int64 total of per-row float counts."""
    return rows.to(torch.int64).sum()


def _clip_stats(
    r: Tensor, adv: Tensor, valid: Tensor, n: Tensor, eps_low: Bound, eps_high: Bound,
    log_dual: Bound | None,
) -> ClipStatsTuple:  # fmt: skip
    """The fields of :class:`ClipStats`, in order, as a tuple (a compiled kernel returns it)."""
    low, high, dual = _clip_counts(r, adv, valid, eps_low, eps_high, log_dual)
    nf = n.clamp(min=1).to(r.dtype)
    # extrema per row first, so that they fuse with the row sums into one pass over (B, T)
    return (
        _total(n),
        _total(low),
        _total(high),
        None if dual is None else _total(dual),
        low / nf,
        high / nf,
        n > 0,
        _masked_extreme(_masked_extreme(r, valid, "min", dim=-1), n > 0, "min"),
        _masked_extreme(_masked_extreme(r, valid, "max", dim=-1), n > 0, "max"),
    )


# --------------------------------------------------------------------------------------------
# Public building blocks
# --------------------------------------------------------------------------------------------


def clip_log_ratio(
    log_ratio: Tensor, *, epsilon: float = 0.4, epsilon_high: float | None = None
) -> Tensor:
    """Two-sided clip of log-ratios to ``[-epsilon, epsilon_high]``: ``clip(rho, e^-eps, e^eps_h)``.

    This is the ``clip(.)`` inside the paper's Eq. 4 written in log space. A value exactly on a
    bound is not clipped (its gradient is 1, as with :func:`torch.clamp`).

    Shape:
        log_ratio: any shape. Output: the same shape.
    """
    eps_low, eps_high, _ = _checks.check_hyperparameters(epsilon, epsilon_high)
    _checks._floating("log_ratio", log_ratio)
    return log_ratio.clamp(min=-eps_low, max=eps_high)


def trust_region_log_ratio(
    log_ratio: Tensor,
    advantages: Tensor,
    *,
    epsilon: float = 0.4,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
) -> Tensor:
    """One-sided, sign-aware clip of log-ratios: PPO's trust region in log space.

    ``min(rho A, clip(rho, e^-eps_l, e^eps_h) A) = A * exp(c)`` with (DESIGN §5.1)::

        c = min(r, eps_h)                 where A >= 0
        c = max(r, -eps_l)                where A <  0   (and min(c, log dual_clip) if given)

    A value exactly on a bound is not clipped. With ``dual_clip`` this equals GRPO's ``delta``
    (``clamp(ratio, max=delta)``) for negative advantages.

    Shape:
        log_ratio: (B, T) per token, or (B,) per sequence. advantages: (B,).
        Output: the shape of ``log_ratio``.
    """
    eps_low, eps_high, log_dual = _checks.check_hyperparameters(epsilon, epsilon_high, dual_clip)
    _checks.check_log_ratio_inputs(log_ratio, advantages)
    return _trust_region(log_ratio, advantages.to(log_ratio.dtype), eps_low, eps_high, log_dual)


def masked_geometric_mean(log_values: Tensor, mask: Tensor) -> Tensor:
    """Log of the geometric mean of ``exp(log_values)`` over each row's valid positions.

    ``log G_i = sum_t mask_t x_t / max(n_i, 1)`` with ``n_i = sum_t mask_t``: the ``1/|o_i|``
    root of Eq. 4, in log space (so it never overflows). An empty row gives 0 (G = 1). Values at
    masked positions never matter, NaN and inf included.

    Shape:
        log_values: (B, T). mask: (B, T) bool or 0/1. Output: (B,).
    """
    _checks._floating("log_values", log_values)
    valid = _valid(_checks.check_mask(mask, log_values, "log_values"), None)
    return _masked_mean(log_values, valid, _count(valid, log_values))


def sequence_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence KL to the reference policy: token mean of the k3 estimator.

    ``KL_i = sum_t mask (expm1(d_t) - d_t) / max(n_i, 1)``, ``d = ref_logp - logp``. Written with
    ``expm1`` it is never negative, even in float32. Gradients flow to ``logp`` only.

    Shape:
        logp, ref_logp, mask: (B, T). Output: (B,).
    """
    _checks._floating("logp", logp)
    _checks._floating("ref_logp", ref_logp)
    if ref_logp.shape != logp.shape:
        raise ValueError(
            f"ref_logp must have the shape of logp {tuple(logp.shape)}, got {tuple(ref_logp.shape)}"
        )
    valid = _valid(_checks.check_mask(mask, logp, "logp"), None)
    return _masked_mean(_k3(logp, ref_logp.detach(), valid), valid, _count(valid, logp))


@dataclass(frozen=True)
class ClipStats:
    """Sums, counts and extrema over valid tokens: enough for an exact global reduction.

    Counts are int64; sum them across processes, take the min of ``log_ratio_min`` and the max of
    ``log_ratio_max``, concatenate the per-row tensors, then call :meth:`metrics`.

    Shape:
        num_*: (). row_clip_low, row_clip_high, row_nonempty: (B,). log_ratio_min/max: ().
    """

    num_tokens: Tensor
    num_clipped_low: Tensor
    num_clipped_high: Tensor
    num_clipped_dual: Tensor | None
    row_clip_low: Tensor  # fraction of the row's valid tokens clipped low
    row_clip_high: Tensor
    row_nonempty: Tensor  # bool: the row has a valid token
    log_ratio_min: Tensor  # +inf when there is no valid token
    log_ratio_max: Tensor  # -inf when there is no valid token

    def as_tuple(self) -> ClipStatsTuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def metrics(self) -> dict[str, Tensor]:
        """The DESIGN §6 metrics as 0-d detached tensors (NaN where undefined)."""
        return metrics_dict(
            metric_vector(self.as_tuple(), None), self.num_clipped_dual is not None, False
        )


METRIC_KEYS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "log_ratio/min",
    "log_ratio/max",
    "clip_ratio/dual_mean",  # only with a dual clip
    "kl",  # only with beta != 0
)


def metric_vector(stats: ClipStatsTuple, kl_sum: Tensor | None) -> Tensor:
    """Every metric of DESIGN §6, in the order of METRIC_KEYS, as one (9,) tensor: one small
    kernel instead of a dozen (the fused path computes it inside its forward kernel)."""
    num, low, high, dual, row_low, row_high, nonempty, lr_min, lr_max = stats
    n = num.clamp(min=1).to(row_low.dtype)
    has = num > 0
    nan = float("nan")
    zero = n.new_zeros(())
    low_mean, high_mean = low / n, high / n
    return torch.stack(
        [
            low_mean,
            high_mean,
            low_mean + high_mean,
            torch.where(has, _masked_extreme(row_low, nonempty, "min"), nan),
            torch.where(has, _masked_extreme(row_high, nonempty, "max"), nan),
            torch.where(has, lr_min, nan),
            torch.where(has, lr_max, nan),
            zero if dual is None else dual / n,
            zero if kl_sum is None else kl_sum / n,
        ]
    ).detach()


def metrics_dict(vector: Tensor, dual: bool, kl: bool) -> dict[str, Tensor]:
    """The metric vector as a mapping of 0-d tensors (views), without absent metrics."""
    out = dict(zip(METRIC_KEYS, vector.unbind(), strict=True))
    if not dual:
        del out["clip_ratio/dual_mean"]
    if not kl:
        del out["kl"]
    return out


def _masked_extreme(x: Tensor, keep: Tensor, kind: str, dim: int | None = None) -> Tensor:
    """Min or max of ``x`` over ``keep`` (over ``dim``, or all of it): +inf / -inf where nothing
    is kept."""
    fill = float("inf") if kind == "min" else float("-inf")
    if x.numel() == 0:
        shape = () if dim is None else x.shape[:dim] + x.shape[dim:][1:]
        return x.new_full(shape, fill)
    masked = torch.where(keep, x, fill)
    if dim is None:
        return masked.amin() if kind == "min" else masked.amax()
    return masked.amin(dim) if kind == "min" else masked.amax(dim)


def clip_metrics(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = 0.4,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
) -> ClipStats:
    """Where the one-sided clip took effect, and the range of the unclipped log-ratio.

    A token counts as clipped low if ``A < 0`` and ``r < -eps_l``, high if ``A > 0`` and
    ``r > eps_h``, dual if ``A < 0`` and ``r > log dual_clip``: exactly the tokens whose gradient
    the trust region zeroes. Rows with ``A = 0`` are never clipped but their tokens count in the
    denominators (as in TRL and verl).

    Shape:
        log_ratio, mask: (B, T). advantages: (B,).
    """
    eps_low, eps_high, log_dual = _checks.check_hyperparameters(epsilon, epsilon_high, dual_clip)
    _checks.check_log_ratio_inputs(log_ratio, advantages)
    valid = _valid(_checks.check_mask(mask, log_ratio, "log_ratio"), None)
    r = log_ratio.detach()
    return ClipStats(
        *_clip_stats(
            r, advantages.to(r.dtype), valid, _count(valid, r), eps_low, eps_high, log_dual
        )
    )
