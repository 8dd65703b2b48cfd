"""``impl="compiled"``: the math layer's forward under ``torch.compile``, public API only.

:func:`gmpo_core._math.forward` is compiled with ``torch.compile(dynamic=True, fullgraph=True)``
(a new (B, T) or N does not recompile; packed input and a process group are inputs of the same
function, the group's collectives traced into its graph), entered through one code object per
structure of the inputs (:func:`compiled_variant`), and runs inside the same
``torch.autograd.Function`` as the plain path, whose backward scales the gradient the forward
wrote. Hyper-parameters enter as
0-d tensors built on each call, so new values never recompile and nothing is cached across calls.
The compiled function is created once, on first use; a failing call raises and changes nothing
for the next one. The first call of each input signature (dtypes, devices, which optional inputs
are given) compiles: seconds (docs/api.md gives the measured times).
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable

import torch
from torch import Tensor

from gmpo_core import _math

# Dynamo's compilation is not safe for threads that make their first calls at once (they race
# into repeated recompilations): calls of the compiled kernel take turns.
_LOCK = threading.Lock()


@functools.cache
def compiled_forward() -> Callable[
    [_math.Batch, _math.Hyper, bool, _math.Across | None], _math.Forward
]:
    """:func:`gmpo_core._math.forward` under ``torch.compile`` (created on first use)."""
    return torch.compile(_math.forward, dynamic=True, fullgraph=True)


def structure(b: _math.Batch, h: _math.Hyper, across: _math.Across | None) -> tuple[str, ...]:
    """Which optional inputs a call has, and its dtype where not float32: () for the plainest
    call. Each structure is compiled as an entry point of its own (:func:`compiled_variant`)."""
    parts = {
        "packed": b.cu_seqlens is not None,
        "kl": b.ref_logp is not None,
        "token_weights": b.w_tok is not None,
        "row_weights": b.w_row is not None,
        "dual_clip": h.log_dual is not None,
        "group": across is not None,
    }
    key = tuple(name for name, present in parts.items() if present)
    dtype = b.logp.dtype
    return key if dtype == torch.float32 else (*key, str(dtype).removeprefix("torch."))


def _entry(
    b: _math.Batch, h: _math.Hyper, with_grad: bool, across: _math.Across | None = None
) -> _math.Forward:
    return _math.forward(b, h, with_grad, across)


@functools.cache
def compiled_variant(
    key: tuple[str, ...],
) -> Callable[[_math.Batch, _math.Hyper, bool, _math.Across | None], _math.Forward]:
    """:func:`gmpo_core._math.forward` under ``torch.compile``, entered through a code object of
    its own for the structure ``key`` (created on first use). Dynamo counts recompilations
    per code object, and every input signature (structure, dtype, and sizes 0 and 1, which it
    specializes) is one: with a single entry point, a program that uses many structures
    exhausts ``recompile_limit`` (8 by default, then ``fullgraph=True`` raises). Per structure,
    only sizes and ``with_grad`` vary."""
    name = "forward_" + "_".join(key)
    fn = types.FunctionType(_entry.__code__.replace(co_name=name), _entry.__globals__, name)
    fn.__defaults__ = _entry.__defaults__
    return torch.compile(fn, dynamic=True, fullgraph=True)


def kernel() -> Callable[[_math.Batch, _math.Hyper, bool, _math.Across | None], _math.Forward]:
    """The compiled forward, one call at a time across threads."""
    return _serialized


def _serialized(
    b: _math.Batch, h: _math.Hyper, with_grad: bool, across: _math.Across | None = None
) -> _math.Forward:
    key = structure(b, h, across)
    with _LOCK:
        fn = compiled_forward() if not key else compiled_variant(key)
        return fn(b, h, with_grad, across)


def hyper_tensors(h: _math.Hyper, like: Tensor) -> _math.Hyper:
    """The hyper-parameters as 0-d tensors in the compute dtype on ``like``'s device."""
    dual = h.log_dual is not None
    values = [h.eps_low, h.eps_high, h.log_dual if dual else 0.0, h.beta]
    dtype = _math.compute_dtype(like.dtype)
    eps_low, eps_high, log_dual, beta = torch.tensor(values, dtype=dtype, device=like.device)
    return _math.Hyper(eps_low, eps_high, log_dual if dual else None, beta)
