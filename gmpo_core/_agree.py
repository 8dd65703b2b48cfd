"""The agreement step of a ``process_group`` call with ``check_values=True`` (docs/semantics.md,
S15): before any other collective, every rank validates its own input and sends one fixed-size
header (its sizes, dtype, which inputs are given, hyper-parameters, a checksum of the
advantages, and its validation error if any) in one ``all_gather``. Every rank then raises the
same ``ValueError`` naming what differs or which rank's input was refused, or none does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from gmpo_core._math import Batch, Hyper
from gmpo_core.options import IMPLS

# what is compared, in header order (one float64 each)
FIELDS = (
    "rows (B, or S with cu_seqlens)",
    "logp dtype",
    "inputs given (old_logp, ref_logp, token is_weights, row is_weights, cu_seqlens)",
    "impl",
    "epsilon",
    "epsilon_high",
    "dual_clip",
    "beta",
    "advantages (checksum)",
    "advantages (weighted checksum)",
)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # others: -1
_MESSAGE_BYTES = 512


class Call(NamedTuple):
    """What a rank's header describes besides the validated tensors."""

    logp: object  # as passed (it may not be a tensor when validation fails)
    old_logp_given: bool
    impl: str
    group: Any  # a torch.distributed ProcessGroup, or None for the default group


def agree(validate: Callable[[], tuple[Hyper, Batch]], call: Call) -> tuple[Hyper, Batch]:
    """Run ``validate`` (this rank's checks) and the agreement step; return its result on every
    rank, or raise one ``ValueError`` on every rank."""
    error: ValueError | None = None
    done = None
    try:
        done = validate()
    except ValueError as e:
        error = e
    try:
        mine = header(call, done, error)
        parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(call.group))]
        dist.all_gather(parts, mine, group=call.group)
        message = verdict([p.cpu() for p in parts])
        if message is not None or done is None:
            raise ValueError(message) from error
        return done
    finally:
        # ``error``'s traceback holds this frame: without this, the cycle would keep the
        # group alive until a garbage collection, past destroy_process_group
        error = None


def header(call: Call, done: tuple[Hyper, Batch] | None, error: ValueError | None) -> Tensor:
    """This rank's header: the float64 :data:`FIELDS` (NaN where validation failed) and the
    error message, as bytes. Shape: (8 * len(FIELDS) + 512,) uint8."""
    device = call.logp.device if isinstance(call.logp, Tensor) else torch.device("cpu")
    text = b"" if error is None else str(error).encode()[:_MESSAGE_BYTES]
    message = torch.zeros(_MESSAGE_BYTES, dtype=torch.uint8)
    if text:
        message[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    if done is None:
        numbers = torch.full((len(FIELDS),), math.nan, dtype=torch.float64, device=device)
    else:
        numbers = fields(call, *done)
    return torch.cat([numbers.view(torch.uint8), message.to(device)])


def fields(call: Call, h: Hyper, b: Batch) -> Tensor:
    """The float64 :data:`FIELDS` of a validated call. Shape: (len(FIELDS),)."""
    given = [call.old_logp_given, b.ref_logp is not None, b.w_tok is not None]
    given += [b.w_row is not None, b.cu_seqlens is not None]
    code = sum(2**i for i, g in enumerate(given) if g)
    dtype = _DTYPES.index(b.logp.dtype) if b.logp.dtype in _DTYPES else -1
    dual = -1.0 if h.log_dual is None else math.exp(float(h.log_dual))
    head = [b.adv.shape[0], dtype, code, IMPLS.index(call.impl)]
    head += [float(h.eps_low), float(h.eps_high), dual, float(h.beta)]
    adv = b.adv.to(torch.float64)
    position = torch.arange(1, adv.shape[0] + 1, dtype=torch.float64, device=adv.device)
    numbers = torch.tensor(head, dtype=torch.float64, device=adv.device)
    return torch.cat([numbers, torch.stack([adv.sum(), (adv * position).sum()])])


def verdict(parts: list[Tensor]) -> str | None:
    """The error every rank raises, from the gathered headers (on the host), or None."""
    n = 8 * len(FIELDS)
    for rank, p in enumerate(parts):
        text = bytes(p[n:].tolist()).rstrip(b"\0")
        if text or bool(p[:n].view(torch.float64).isnan().any()):
            return f"gmpo_loss: rank {rank}'s input was refused: {text.decode(errors='replace')}"
    values = torch.stack([p[:n].view(torch.float64) for p in parts])  # (ranks, fields)
    for i, name in enumerate(FIELDS):
        column = values[:, i].tolist()
        if len(set(column)) > 1:
            per_rank = ", ".join(f"rank {r}: {_show(i, v)}" for r, v in enumerate(column))
            return (
                f"gmpo_loss: the ranks of process_group disagree on {name} ({per_rank}); every "
                "rank must pass the same rows, advantages and options"
            )
    return None


def _show(field: int, value: float) -> str:
    if FIELDS[field] == "logp dtype":
        return str(_DTYPES[int(value)]) if value >= 0 else "another dtype"
    if FIELDS[field] == "impl":
        return IMPLS[int(value)]
    if FIELDS[field] == "dual_clip" and value == -1:
        return "None"
    return repr(int(value)) if FIELDS[field].startswith(("rows", "inputs")) else repr(value)
