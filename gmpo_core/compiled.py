"""``impl="compiled"``: the math layer's forward under ``torch.compile``, public API only.

:func:`gmpo_core._math.forward` is compiled with ``torch.compile(dynamic=True)``
(a new (B, T) or N does not recompile; packed input and a process group are inputs of the same
function, the group's collectives traced into its graph) and runs inside the same
``torch.autograd.Function`` as the plain path, whose backward scales the gradient the forward
wrote. Hyper-parameters enter as
0-d tensors filled on the device on each call (no copy from the host), so new values never
recompile and nothing is cached across calls.
The compiled function is created once, on first use; a failing call raises and changes nothing
for the next one. The first call of each input signature (dtypes, devices, which optional inputs
are given) compiles: seconds (docs/api.md gives the measured times). On the ``meta`` device,
which the compiler cannot generate code for, the same function runs uncompiled.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable

import torch
from torch import Tensor

from gmpo_core import _across, _math

# Dynamo's compilation is not safe for threads that make their first calls at once (they race
# into repeated recompilations): calls of the compiled kernel take turns.
_LOCK = threading.Lock()

# Device types the compiler cannot generate code for: there the compiled path runs the same
# function uncompiled, after the same preparation (its hyper-parameters as 0-d tensors, the mask
# as bytes). ``meta`` tensors have no values: Inductor's code for them fails inside the compiler
# ("... used before it has been defined", torch 2.13); the function itself runs (shapes only).
UNCOMPILED = frozenset({"meta"})


@functools.cache
def compiled_forward() -> Callable[
    [_math.Batch, _math.Hyper, bool, _across.Across | None], _math.Forward
]:
    """:func:`gmpo_core._math.forward` under ``torch.compile`` (created on first use). Not
    ``fullgraph``: the function has no graph break (tests/core/test_compile.py compiles it with
    ``fullgraph=True``), but past torch's recompile limit (8 input signatures of one function
    in a process by default) a ``fullgraph`` function raises, where this one runs uncompiled,
    with torch's warning."""
    return torch.compile(_math.forward, dynamic=True)


def kernel() -> Callable[[_math.Batch, _math.Hyper, bool, _across.Across | None], _math.Forward]:
    """The compiled forward, one call at a time across threads (uncompiled on the device types
    of :data:`UNCOMPILED`)."""
    return _serialized


def _serialized(
    b: _math.Batch, h: _math.Hyper, with_grad: bool, across: _across.Across | None = None
) -> _math.Forward:
    if b.mask.dtype == torch.bool:  # a zero-copy view: compiled code loads bytes ~5x faster
        b = b._replace(mask=b.mask.view(torch.uint8))
    if b.logp.device.type in UNCOMPILED:
        return _math.forward(b, h, with_grad, across)
    with _LOCK, _every_size_dynamic():
        return compiled_forward()(b, h, with_grad, across)


# The sources whose sizes are each dynamic on their own: the tensors of _math.forward's argument
# ``b`` (the Batch), in Dynamo's naming of a compiled frame's arguments (``L['x']``, as
# torch.compiler.config.dynamic_sources documents it).
BATCH_SOURCES = r"L\['b'\]"


def _every_size_dynamic() -> contextlib.AbstractContextManager[object]:
    """Every size of the batch dynamic on its own, for the compilation that the call may start:
    ``torch.compiler.config.dynamic_sources`` (public). ``dynamic=True`` alone sizes "by duck":
    two sizes equal at the first call (a (4, 4) batch, B = T) become one symbol, and every later
    call with B != T compiles again. The setting is read while Dynamo traces, so it is set for
    the duration of the call (under :data:`_LOCK`); a compilation that another thread starts
    meanwhile sees it too, and there it names no source (the pattern is anchored on ``b``, the
    compiled function's argument) unless that function also has an argument ``b``, whose sizes
    then compile dynamic. A torch without the setting: a no-op (duck sizing stays)."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "dynamic_sources"):
        return contextlib.nullcontext()
    patch: contextlib.AbstractContextManager[object] = config.patch(dynamic_sources=BATCH_SOURCES)
    return patch


def worth_compiling(logp: Tensor, advantages: Tensor) -> bool:
    """False for a batch with one row or one token per row: torch.compile specializes sizes 0
    and 1, so such a call would cost a compilation of its own for nothing to gain; it runs the
    same function uncompiled."""
    return bool(min(*logp.shape, *advantages.shape) > 1)


def hyper_tensors(h: _math.Hyper, like: Tensor) -> _math.Hyper:
    """The hyper-parameters as 0-d tensors in the compute dtype on ``like``'s device, each a fill
    on the device: the number travels as a kernel argument. (``torch.tensor(<list>, device=)``
    would copy host memory to the device, on CUDA a synchronizing copy, on every call.)"""

    def fill(value: _math.Bound) -> Tensor:
        return torch.full(
            (), float(value), dtype=_math.compute_dtype(like.dtype), device=like.device
        )

    dual = None if h.log_dual is None else fill(h.log_dual)
    return _math.Hyper(fill(h.eps_low), fill(h.eps_high), dual, fill(h.beta))
