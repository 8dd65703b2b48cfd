"""Hypothesis strategies for GMPO inputs, all in one place.

Shapes are drawn first, then per-row lengths; masks are built from the lengths (plus optional
holes, like TRL's ``tool_mask``), so failures shrink to short rows in small batches. Values are
bounded float32 (|r| <= 20 at valid positions, docs/semantics.md S9); edge cases (A = 0, empty rows, ratios
far outside the clip range, zero rollout weights) are forced with ``sampled_from``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

# No subnormals: on torch 2.4 the first compiled call makes the process flush them to zero
# (docs/api.md), after which Hypothesis refuses to draw them; no test depends on them.
F32 = dict(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False)

advantage_values = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5, -2.0]), st.floats(-5, 5, **F32))
# log-ratio offsets: mostly inside a typical clip range, sometimes far outside it
log_ratio_values = st.one_of(
    st.floats(-1, 1, **F32), st.floats(-10, 10, **F32), st.sampled_from([0.0, 3.0, -3.0])
)
weight_values = st.one_of(st.floats(0.0625, 3, **F32), st.just(0.0))


@dataclass(frozen=True)
class Batch:
    """One drawn GMPO call: numpy arrays (float32, mask bool) and keyword arguments."""

    logp: np.ndarray
    old_logp: np.ndarray
    advantages: np.ndarray
    mask: np.ndarray
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return self.logp.shape  # type: ignore[return-value]

    def with_kwargs(self, **kw: Any) -> Batch:
        return replace(self, kwargs={**self.kwargs, **kw})


@st.composite
def batches(
    draw: st.DrawFn,
    *,
    max_b: int = 6,
    max_t: int = 12,
    min_size: int = 1,
    beta: bool = True,
    weights: bool = True,
    dual: bool = True,
    asymmetric: bool = True,
) -> Batch:
    b = draw(st.integers(min_size, max_b))
    t = draw(st.integers(min_size, max_t))
    lengths = np.array(draw(st.lists(st.integers(0, t), min_size=b, max_size=b)))
    mask = np.arange(t)[None, :] < lengths[:, None]
    if draw(st.booleans()):
        mask &= ~draw(arrays(np.bool_, (b, t)))  # holes inside rows (tool calls, say)
    logp = draw(arrays(np.float32, (b, t), elements=st.floats(-10, 0, **F32)))
    delta = draw(arrays(np.float32, (b, t), elements=log_ratio_values))
    old_logp = (logp - delta).astype(np.float32)
    advantages = draw(arrays(np.float32, (b,), elements=advantage_values))

    kwargs: dict[str, Any] = {"epsilon": draw(st.sampled_from([0.2, 0.4, 0.8, 1.7]))}
    if asymmetric and draw(st.booleans()):
        kwargs["epsilon_high"] = draw(st.sampled_from([0.1, 0.28, 0.6, 2.0]))
    if beta and draw(st.booleans()):
        kwargs["beta"] = draw(st.sampled_from([0.04, 0.5]))
        ref_delta = draw(arrays(np.float32, (b, t), elements=st.floats(-2, 2, **F32)))
        kwargs["ref_logp"] = (logp + ref_delta).astype(np.float32)
    if weights:
        kind = draw(st.sampled_from([None, "row", "row1", "token"]))
        if kind is not None:
            shape = {"row": (b,), "row1": (b, 1), "token": (b, t)}[kind]
            kwargs["is_weights"] = draw(arrays(np.float32, shape, elements=weight_values))
    if dual and draw(st.booleans()):
        kwargs["dual_clip"] = draw(st.sampled_from([1.5, 3.0]))
    return Batch(logp, old_logp, advantages, mask, kwargs)


# exponents of the power mean: the seven, then any in [-4, 4] (masked_power_mean)
POWERS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)
powers = st.one_of(st.sampled_from(POWERS), st.floats(-4, 4, **F32))


@st.composite
def log_value_rows(
    draw: st.DrawFn, *, max_b: int = 5, max_t: int = 12, bound: float = 80.0
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, mask)`` for the power mean: float32 log-values (B, T) within ``[-bound, bound]``,
    each batch around a drawn centre with a drawn spread (0: every value equal; up to the whole
    range, the bounds themselves included), and a bool mask with empty rows and holes."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    lengths = np.array(draw(st.lists(st.integers(0, t), min_size=b, max_size=b)))
    mask = np.arange(t)[None, :] < lengths[:, None]
    if draw(st.booleans()):
        mask &= ~draw(arrays(np.bool_, (b, t)))
    centre = draw(st.one_of(st.floats(-bound, bound, **F32), st.sampled_from([0.0, bound])))
    spread = draw(st.sampled_from([0.0, 1e-3, 0.5, 5.0, bound, 2 * bound]))
    unit = st.one_of(st.floats(-1, 1, **F32), st.sampled_from([-1.0, 1.0]))
    offsets = draw(arrays(np.float64, (b, t), elements=unit))
    x = np.clip(centre + spread * offsets, -bound, bound).astype(np.float32)
    return x, mask


def garbage() -> st.SearchStrategy[float]:
    """Values that must never matter at masked positions."""
    return st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 3e38])


@dataclass(frozen=True)
class PackedBatch:
    """One drawn packed GMPO call (1-D tokens, ``cu_seqlens``) and ``padded``, the same rows
    padded: row i is the first ``lengths[i]`` columns of the padded row (the rest masked)."""

    logp: np.ndarray  # (N,)
    old_logp: np.ndarray  # (N,)
    advantages: np.ndarray  # (S,)
    mask: np.ndarray  # (N,)
    cu_seqlens: np.ndarray  # (S + 1,) int32 or int64
    kwargs: dict[str, Any]
    padded: Batch


def pack(batch: Batch, lengths: np.ndarray, index_dtype: Any = np.int64) -> PackedBatch:
    """Row i of ``batch`` cut to its first ``lengths[i]`` columns, packed."""
    b, t = batch.shape
    keep = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
    kw: dict[str, Any] = {}
    for key, value in batch.kwargs.items():
        if key == "is_weights" and not (value.ndim == 2 and value.shape[1] > 1):
            kw[key] = value.reshape(b, 1)  # row weights: (S, 1)
        elif isinstance(value, np.ndarray):
            kw[key] = value[keep]  # per token
        else:
            kw[key] = value
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(index_dtype)
    padded = replace(batch, mask=batch.mask & keep)
    return PackedBatch(batch.logp[keep], batch.old_logp[keep], batch.advantages,
                       batch.mask[keep], cu, kw, padded)  # fmt: skip


@st.composite
def packed_batches(draw: st.DrawFn, **kw: Any) -> PackedBatch:
    """A padded batch from :func:`batches`, each row cut to a drawn length (empty segments
    included) and packed, with int32 or int64 ``cu_seqlens``."""
    batch = draw(batches(**kw))
    b, t = batch.shape
    lengths = np.array(draw(st.lists(st.integers(0, t), min_size=b, max_size=b)), np.int64)
    return pack(batch, lengths, draw(st.sampled_from([np.int32, np.int64])))
