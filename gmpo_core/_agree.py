"""The agreement step of a ``process_group`` call with ``check_values=True`` (docs/semantics.md,
S15), before any other collective:

1. One all-reduce with MIN of the five float64 that a split forward's first collective carries
   (:func:`gmpo_core._across.first_collective`), with a 1 where the forward has a 0. If a rank
   did not ask for ``check_values``, it is in its forward, and the collectives met: the ranks
   that check join its next one (the sums, with +inf: its loss is NaN) and raise. A rank
   that does not check cannot read that without a host-device synchronization.
2. Every rank validates its own input (any ``Exception``) and sends one fixed-size header (its
   sizes, dtype, which inputs are given, hyper-parameters, a digest of the advantages and of the
   row weights, and its validation error if any) in one ``all_gather``. Every rank then raises
   the same ``ValueError`` naming what differs or which rank's input was refused, or none does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from gmpo_core._across import SUMS_DTYPES
from gmpo_core._math import Batch, Hyper
from gmpo_core.options import IMPLS

# what is compared, in header order: a name and its number of float64 slots
FIELDS: tuple[tuple[str, int], ...] = (
    ("rows (B, or S with cu_seqlens)", 1),
    ("logp dtype", 1),
    ("inputs given (old_logp, ref_logp, token is_weights, row is_weights, cu_seqlens)", 1),
    ("impl", 1),
    ("epsilon", 1),
    ("epsilon_high", 1),
    ("dual_clip", 1),
    ("beta", 1),
    ("advantages (digest of their float64 values)", 2),
    ("row is_weights (digest of their float64 values)", 2),
)
_SLOTS = 1 + sum(width for _, width in FIELDS)  # slot 0: 1 where this rank's input was refused
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # others: -1
_MESSAGE_BYTES = 512
# two polynomial hashes, each modulo a prime below 2^31 (every product fits in int64)
_LANES = ((2**31 - 1, 16807), (2147483629, 48271))


class Call(NamedTuple):
    """What a rank's header describes besides the validated tensors."""

    logp: object  # as passed (it may not be a tensor when validation fails)
    old_logp_given: bool
    impl: str
    group: Any  # a torch.distributed ProcessGroup, or None for the default group


def agree(validate: Callable[[], tuple[Hyper, Batch]], call: Call) -> tuple[Hyper, Batch]:
    """Run the agreement step and ``validate`` (this rank's checks); return its result on
    every rank, or raise one ``ValueError`` on every rank (on the ranks that check, where
    ``check_values`` differs)."""
    device = call.logp.device if isinstance(call.logp, Tensor) else torch.device("cpu")
    meet(call.group, device)
    error: Exception | None = None
    done = None
    try:
        done = validate()
    except Exception as e:  # any: a rank never leaves the others in the collective (S15)
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


def meet(group: Any, device: torch.device) -> None:
    """The first collective, the form of a split forward's first one; raise where a rank does
    not check (after joining that rank's all-reduce of its sums)."""
    first = torch.tensor([math.inf, math.inf, 1.0, math.inf, math.inf], dtype=torch.float64)
    first = first.to(device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN, group=group)
    agreeing, numel, code = first[2:].tolist()
    if agreeing == 1.0:
        return
    poison = torch.full((int(-numel),), math.inf, dtype=SUMS_DTYPES[int(-code)], device=device)
    dist.all_reduce(poison, op=dist.ReduceOp.SUM, group=group)
    raise ValueError(
        "gmpo_loss: check_values=True on this rank but not on every rank of process_group: "
        "every rank must pass the same check_values (a rank without it computes on, as it "
        "cannot tell without a host-device synchronization: its loss of this call is NaN)"
    )


def header(call: Call, done: tuple[Hyper, Batch] | None, error: Exception | None) -> Tensor:
    """This rank's header: the float64 slots (slot 0: refused; then :data:`FIELDS`, 0 where
    validation failed) and the error message, as bytes. Shape: (8 * _SLOTS + 512,) uint8."""
    device = call.logp.device if isinstance(call.logp, Tensor) else torch.device("cpu")
    text = message_bytes(error)
    message = torch.zeros(_MESSAGE_BYTES, dtype=torch.uint8)
    if text:
        message[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    if done is None:
        numbers = torch.zeros(_SLOTS, dtype=torch.float64, device=device)
        numbers[0] = 1.0
    else:
        refused = torch.zeros(1, dtype=torch.float64, device=device)
        numbers = torch.cat([refused, fields(call, *done)])
    return torch.cat([numbers.view(torch.uint8), message.to(device)])


def message_bytes(error: Exception | None) -> bytes:
    """The validation error as at most 512 bytes of UTF-8, cut on a character boundary; an
    exception other than a ``ValueError`` is named."""
    if error is None:
        return b""
    text = str(error) or "(no message)"
    if not isinstance(error, ValueError):
        text = f"{type(error).__name__}: {text}"
    cut = text.encode(errors="backslashreplace")[:_MESSAGE_BYTES]
    return cut.decode(errors="ignore").encode()  # drops a character the cut split


def fields(call: Call, h: Hyper, b: Batch) -> Tensor:
    """The float64 :data:`FIELDS` of a validated call. Shape: (_SLOTS - 1,)."""
    given = [call.old_logp_given, b.ref_logp is not None, b.w_tok is not None]
    given += [b.w_row is not None, b.cu_seqlens is not None]
    code = sum(2**i for i, g in enumerate(given) if g)
    dtype = _DTYPES.index(b.logp.dtype) if b.logp.dtype in _DTYPES else -1
    dual = -1.0 if h.log_dual is None else float(h.log_dual)  # log_dual > 0
    head = [b.adv.shape[0], dtype, code, IMPLS.index(call.impl)]
    head += [float(h.eps_low), float(h.eps_high), dual, float(h.beta)]
    numbers = torch.tensor(head, dtype=torch.float64, device=b.adv.device)
    weights = digest(b.adv[:0] if b.w_row is None else b.w_row)
    return torch.cat([numbers, digest(b.adv), weights])


def digest(t: Tensor) -> Tensor:
    """A 62-bit digest of ``t``'s values as float64, on ``t``'s device: two polynomial hashes
    ``sum_j (u_j + 1) g^j mod p`` of its 16-bit words ``u_j``. Bitwise, but ``-0.0`` is read as
    ``0.0`` (they give the same loss); NaN never comes here (check_values refuses it).
    Shape: (n,) -> (2,) float64, integers below 2^31 (exact)."""
    x = (t.detach().to(torch.float64) + 0.0).contiguous()  # -0.0 + 0.0 = 0.0
    words = (x.view(torch.int16).to(torch.int64) & 0xFFFF) + 1  # (4n,) in [1, 2^16]
    lanes = [(words * powers(words.shape[0], p, g, words.device) % p).sum() % p for p, g in _LANES]
    return torch.stack(lanes).to(torch.float64)  # each a sum of 4n terms below 2^31: exact


def powers(n: int, p: int, g: int, device: torch.device) -> Tensor:
    """``g^j mod p`` for ``j < n``, as the products of two short tables (``g^(1024 a)`` and
    ``g^b``, b < 1024) built on the host. Shape: (n,) int64."""
    low = [1]
    for _ in range(1023):
        low.append(low[-1] * g % p)
    step, high = low[-1] * g % p, [1]
    for _ in range(max(n - 1, 0) // 1024):
        high.append(high[-1] * step % p)
    table = torch.tensor(high, device=device)[:, None] * torch.tensor(low, device=device) % p
    return table.reshape(-1)[:n]


def verdict(parts: list[Tensor]) -> str | None:
    """The error every rank raises, from the gathered headers (on the host), or None."""
    n = 8 * _SLOTS
    numbers = [p[:n].view(torch.float64) for p in parts]
    for rank, (p, x) in enumerate(zip(parts, numbers, strict=True)):
        if x[0] != 0:
            text = bytes(p[n:].tolist()).rstrip(b"\0").decode(errors="replace")
            return f"gmpo_loss: rank {rank}'s input was refused: {text}"
    values = torch.stack(numbers)[:, 1:].tolist()  # (ranks, slots)
    start = 0
    for name, width in FIELDS:
        column = [tuple(row[start : start + width]) for row in values]
        start += width
        if any(v != column[0] for v in column):
            per_rank = ", ".join(f"rank {r}: {_show(name, v)}" for r, v in enumerate(column))
            return (
                f"gmpo_loss: the ranks of process_group disagree on {name} ({per_rank}); every "
                "rank must pass the same rows, advantages, row weights and options"
            )
    return None


def _show(name: str, value: tuple[float, ...]) -> str:
    if "digest" in name:
        return "".join(f"{int(v):08x}" for v in value)
    v = value[0]
    if name == "logp dtype":
        return str(_DTYPES[int(v)]) if v >= 0 else "another dtype"
    if name == "impl":
        return IMPLS[int(v)]
    if name == "dual_clip":
        return "None" if v == -1 else repr(math.exp(v))
    return repr(int(v)) if name.startswith(("rows", "inputs")) else repr(v)
