"""The stability study's methods: :data:`METHODS`, the loss variants of
:mod:`gmpo_tasks.variants` by name (``--methods`` takes these names, or ``module:function`` for
a method defined elsewhere: ``gmpo_tasks.variants.resolve``), and the
:func:`fingerprint` of each method's definition, under which its runs are cached (after a change
to a method, a rerun recomputes its runs). To study a variant, add it to
``gmpo_tasks.variants.METHODS`` (docs/contributing.md)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
import types
from typing import Any

from gmpo_tasks.variants import METHODS, Method, resolve

__all__ = ["METHODS", "Method", "fingerprint", "resolve"]


_PLAIN = (int, float, complex, str, bytes, bool, type(None))
#: libraries whose functions a fingerprint names rather than reads (gmpo_core's source is in
#: ``studies.stability.run.code_fingerprint``; torch's version too)
_NAMED = ("gmpo_core", "torch", "numpy")


def _library(fn: types.FunctionType) -> bool:
    top = fn.__module__.split(".")[0]
    path = fn.__code__.co_filename
    return top in _NAMED or top in sys.stdlib_module_names or "-packages" in path


def _describe(obj: Any, seen: set[int], out: list[str]) -> None:
    """Append to ``out`` what defines ``obj``: for a function, its source, defaults and closure,
    and, recursively, the functions and constants it reads from its module's globals; for a
    ``functools.partial``, its function and arguments. A library's function (gmpo_core, torch,
    the standard library) is named, not read."""
    if isinstance(obj, _PLAIN) or (
        isinstance(obj, tuple) and all(isinstance(x, _PLAIN) for x in obj)
    ):
        out.append(repr(obj))
    elif isinstance(obj, functools.partial):
        out.append(f"partial{obj.args!r}{sorted(obj.keywords.items())!r}")
        _describe(obj.func, seen, out)
    elif isinstance(obj, types.FunctionType):
        out.append(f"{obj.__module__}.{obj.__qualname__}")
        if id(obj) in seen or _library(obj):
            return
        seen.add(id(obj))
        out += [inspect.getsource(obj), repr(obj.__defaults__), repr(obj.__kwdefaults__)]
        for cell in obj.__closure__ or ():
            _describe(cell.cell_contents, seen, out)
        for name in _names(obj.__code__):
            value = obj.__globals__.get(name)
            if name in obj.__globals__ and not isinstance(value, types.ModuleType):
                out.append(name)
                _describe(value, seen, out)
    elif isinstance(obj, type | types.BuiltinFunctionType):
        out.append(f"{obj.__module__}.{obj.__qualname__}")
    else:  # a callable object: its class and its state
        out.append(f"{type(obj).__module__}.{type(obj).__qualname__}{sorted(vars(obj).items())!r}")


def _names(code: types.CodeType) -> list[str]:
    """The global names a code object and the code objects nested in it (lambdas) read."""
    nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return [*code.co_names, *(n for c in nested for n in _names(c))]


def fingerprint(name: str) -> str:
    """sha256 of the definition of ``resolve(name)``'s loss: its source, its parameters
    (defaults, closure, ``functools.partial`` arguments) and every function and constant it
    reads, recursively (not the label, which changes no run). The same in every process."""
    out: list[str] = []
    _describe(resolve(name).loss, set(), out)
    return hashlib.sha256("\0".join(out).encode()).hexdigest()
