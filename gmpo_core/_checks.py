"""Argument validation for the public functions.

Everything here looks at shapes, dtypes and Python numbers only, so it never synchronizes with
the device. Checks that must read tensor *values* live in :func:`check_values` and are opt-in.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gmpo_core._math import Hyper
from gmpo_core.options import check_beta, check_hyperparameters


def _fmt(t: Tensor) -> str:
    return f"shape {tuple(t.shape)} and dtype {t.dtype}"


def hyper(
    epsilon: float,
    epsilon_high: float | None,
    dual_clip: float | None,
    beta: float,
    ref_logp: Tensor | None,
) -> Hyper:
    """Validate the hyper-parameters of :func:`gmpo_core.gmpo_loss`."""
    eps_low, eps_high, log_dual = check_hyperparameters(epsilon, epsilon_high, dual_clip)
    return Hyper(eps_low, eps_high, log_dual, check_beta(beta, ref_logp is not None))


def check_log_ratio_inputs(log_ratio: Tensor, advantages: Tensor, name: str = "log_ratio") -> None:
    """Shapes and dtypes of a per-token (B, T) or per-row (B,) log-ratio and its advantages."""
    floating(name, log_ratio)
    real("advantages", advantages)
    if advantages.dim() != 1 or log_ratio.dim() == 0 or advantages.shape[0] != log_ratio.shape[0]:
        raise ValueError(
            f"advantages must have shape (B,) with B = {name}.shape[0]; got advantages with "
            f"{_fmt(advantages)} and {name} with {_fmt(log_ratio)}"
        )


def check_mask(mask: Tensor, like: Tensor, like_name: str) -> Tensor:
    """Check the shape and dtype of a mask (bool, integer or floating 0/1); return it."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype.is_complex:
        raise ValueError(f"mask must be bool, integer or real floating, got dtype {mask.dtype}")
    if mask.shape != like.shape:
        raise ValueError(
            f"mask must have the shape of {like_name} {tuple(like.shape)}, got {tuple(mask.shape)}"
        )
    return mask


class Inputs(NamedTuple):
    """The tensors of a :func:`gmpo_core.gmpo_loss` call, as passed."""

    logp: Tensor
    old_logp: Tensor | None
    advantages: Tensor
    mask: Tensor
    ref_logp: Tensor | None
    is_weights: Tensor | None


def check_inputs(x: Inputs, cu_seqlens: object | None = None) -> Tensor:
    """Validate the tensors of :func:`gmpo_core.gmpo_loss`, padded rows (``cu_seqlens`` None:
    logp (B, T), advantages (B,)) or packed segments (logp (N,), advantages (S,), cu_seqlens
    (S + 1,)); return the mask."""
    packed = cu_seqlens is not None
    logp = x.logp
    floating("logp", logp)
    if not packed and logp.dim() != 2:
        raise ValueError(f"logp must have shape (B, T), got {_fmt(logp)}")
    if packed and logp.dim() != 1:
        raise ValueError(f"with cu_seqlens, logp must have shape (N,) (packed), got {_fmt(logp)}")
    for name, t in (("old_logp", x.old_logp), ("ref_logp", x.ref_logp)):
        if t is not None:
            floating(name, t)
            if t.shape != logp.shape:
                raise ValueError(
                    f"{name} must have the shape of logp {tuple(logp.shape)}, got {tuple(t.shape)}"
                )
    if packed:
        real("advantages", x.advantages)
        if x.advantages.dim() != 1:
            raise ValueError(
                f"with cu_seqlens, advantages must have shape (S,), one per segment, got "
                f"{_fmt(x.advantages)}"
            )
        check_cu_seqlens(cu_seqlens, x.advantages.shape[0], logp.shape[0])
    else:
        check_log_ratio_inputs(logp, x.advantages, name="logp")
    others = {  # one literal: torch 2.4's Dynamo traces neither dict.update nor |=
        "old_logp": x.old_logp, "advantages": x.advantages, "mask": x.mask,
        "ref_logp": x.ref_logp, "is_weights": x.is_weights, "cu_seqlens": cu_seqlens,
    }  # fmt: skip
    check_devices("logp", logp, others)  # type: ignore[arg-type]
    if x.is_weights is not None:
        check_weights(x.is_weights, logp, x.advantages.shape[0], packed)
    return check_mask(x.mask, logp, "logp")


def check_weights(w: Tensor, logp: Tensor, rows: int, packed: bool) -> None:
    """``is_weights`` per token (logp's shape) or per row: (B,) or (B, 1) padded, (S, 1) packed."""
    floating("is_weights", w)
    tokens = tuple(logp.shape)
    if packed and tuple(w.shape) not in (tokens, (rows, 1)):
        raise ValueError(
            f"with cu_seqlens, is_weights must have shape (N,) = {tokens} (token weights) or "
            f"(S, 1) = {(rows, 1)} (row weights), got {tuple(w.shape)}"
        )
    if not packed and tuple(w.shape) not in ((rows,), (rows, 1), tokens):
        raise ValueError(
            f"is_weights must have shape (B,), (B, 1) or (B, T) = {(rows,)}, {(rows, 1)} or "
            f"{tokens}, got {tuple(w.shape)}"
        )


def check_cu_seqlens(cu_seqlens: object, segments: int, n_tokens: int | None = None) -> Tensor:
    """``cu_seqlens`` is a 1-D int32 or int64 tensor of length S + 1, and no segments (S = 0)
    come with no tokens (shape and dtype only: its values are checked on request)."""
    if not isinstance(cu_seqlens, Tensor):
        raise ValueError(f"cu_seqlens must be a tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1:
        raise ValueError(
            f"cu_seqlens must be a 1-D int32 or int64 tensor (segment boundaries, "
            f"flash-attention's convention), got {_fmt(cu_seqlens)}"
        )
    if cu_seqlens.shape[0] != segments + 1:
        raise ValueError(
            f"cu_seqlens must have length len(advantages) + 1 = {segments + 1} (one boundary "
            f"more than segments), got {cu_seqlens.shape[0]}"
        )
    if segments == 0 and n_tokens:
        raise ValueError(
            f"cu_seqlens has no segment (length 1) but there are N = {n_tokens} tokens: every "
            "token must belong to a segment"
        )
    return cu_seqlens


def check_cu_seqlens_values(cu_seqlens: Tensor, n_tokens: int) -> None:
    """Opt-in: ``cu_seqlens`` starts at 0, ends at N and never decreases (a device sync)."""
    if not bool(cu_seqlens[0] == 0) or not bool(cu_seqlens[-1] == n_tokens):
        raise ValueError(
            f"cu_seqlens must start at 0 and end at N = {n_tokens} (the number of tokens), got "
            f"{cu_seqlens[0].item()} and {cu_seqlens[-1].item()}"
        )
    if not bool((cu_seqlens.diff() >= 0).all()):
        raise ValueError("cu_seqlens must be non-decreasing (segment lengths >= 0)")


def check_devices(name: str, first: Tensor, others: dict[str, Tensor | None]) -> None:
    """Every tensor on the device of ``first`` (a mismatch would reach a kernel otherwise)."""
    device = first.device  # read once: each read makes a device object
    for other, t in others.items():
        if isinstance(t, Tensor) and t.device != device:
            raise ValueError(
                f"{other} is on device {t.device} but {name} is on {device}: every tensor "
                "of the loss must be on one device"
            )


def check_values(x: Inputs, cu_seqlens: Tensor | None = None) -> None:
    """Opt-in value checks (they synchronize with the device)."""
    if cu_seqlens is not None:
        check_cu_seqlens_values(cu_seqlens, x.logp.shape[0])
    mask, is_weights = x.mask, x.is_weights
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must hold only 0 and 1 (or False and True)")
    if not bool(x.advantages.isfinite().all()):
        raise ValueError("advantages must be finite (NaN or inf found)")
    valid = mask != 0
    for name, t in (("logp", x.logp), ("old_logp", x.old_logp), ("ref_logp", x.ref_logp)):
        if t is not None and not bool(torch.where(valid, t.isfinite(), True).all()):
            raise ValueError(f"{name} has non-finite values at valid (mask = 1) positions")
    if is_weights is not None:
        w_valid = (
            valid
            if is_weights.shape == mask.shape
            else torch.ones_like(is_weights, dtype=torch.bool)
        )
        ok = torch.where(w_valid, is_weights.isfinite() & (is_weights >= 0), True)
        if not bool(ok.all()):
            raise ValueError("is_weights must be finite and >= 0 at valid positions")


def floating(name: str, t: object) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a real floating tensor, got dtype {t.dtype}")


def real(name: str, t: object) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must be a real (floating or integer) tensor, got dtype {t.dtype}")
