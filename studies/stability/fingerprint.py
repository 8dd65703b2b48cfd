"""The fingerprint of a variant's definition, under which the stability study caches its runs:
after any change to a variant, a rerun recomputes its runs instead of reusing them.

:func:`fingerprint` reads what defines the variant's loss: its source, its defaults, closure and
``functools.partial`` arguments, and, recursively, every function, constant, callable object
(its class's source) and first-party module (its whole source) it reads through its globals;
and the variant's clip bounds (the study's clip metrics read them). A library's function
(gmpo_core, whose source the run's code fingerprint covers, torch, numpy, the standard library,
installed packages) is named, not read.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any

from gmpo_variants import resolve

#: a memory address in a repr ("<object at 0x7f...>"), which differs from process to process
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_PLAIN = (int, float, complex, str, bytes, bool, type(None))
#: libraries whose functions a fingerprint names rather than reads (gmpo_core's source is in
#: ``studies.stability.run.Setup.code_fingerprint``; torch's version too)
_NAMED = ("gmpo_core", "torch", "numpy")


def _library(module: str, path: str) -> bool:
    """Whether code of ``module`` (its file ``path``) is a library's: named, not read."""
    top = module.split(".")[0]
    return top in _NAMED or top in sys.stdlib_module_names or "-packages" in path or not path


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
        if id(obj) in seen or _library(obj.__module__, obj.__code__.co_filename):
            return
        seen.add(id(obj))
        out += [inspect.getsource(obj), repr(obj.__defaults__), repr(obj.__kwdefaults__)]
        for cell in obj.__closure__ or ():
            _describe(cell.cell_contents, seen, out)
        for name in _names(obj.__code__):
            if name in obj.__globals__:
                out.append(name)
                _describe(obj.__globals__[name], seen, out)
    elif isinstance(obj, types.ModuleType):  # read through an attribute: helpers.loss(...)
        path = getattr(obj, "__file__", None) or ""
        out.append(obj.__name__)
        if id(obj) not in seen and not _library(obj.__name__, path):
            seen.add(id(obj))
            out.append(Path(path).read_text(encoding="utf-8"))
    elif isinstance(obj, type | types.BuiltinFunctionType):
        out.append(f"{obj.__module__}.{obj.__qualname__}")
    elif callable(getattr(obj, "__wrapped__", None)):  # functools.wraps, lru_cache: what it wraps
        out.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
        _describe(obj.__wrapped__, seen, out)
    elif callable(obj) and hasattr(obj, "__dict__"):  # a callable object: its class and state
        cls = type(obj)
        out.append(f"{cls.__module__}.{cls.__qualname__}")
        for key, value in sorted(vars(obj).items()):  # described, not repr'd: no addresses
            out.append(key)
            _describe(value, seen, out)
        path = getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
        if id(cls) not in seen and not _library(cls.__module__, path):
            seen.add(id(cls))
            out.append(inspect.getsource(cls))
            for attr in vars(cls).values():  # the functions its methods read, recursively
                if isinstance(attr, types.FunctionType):
                    _describe(attr, seen, out)
    else:  # a constant of another type (a tensor, a dtype...): its repr, without addresses
        out.append(f"{type(obj).__qualname__}:{_ADDRESS.sub('', repr(obj))}")


def _names(code: types.CodeType) -> list[str]:
    """The global names a code object and the code objects nested in it (lambdas) read."""
    nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return [*code.co_names, *(n for c in nested for n in _names(c))]


def fingerprint(name: str) -> str:
    """sha256 of the definition of ``resolve(name)``: its loss's source, its parameters
    (defaults, closure, ``functools.partial`` arguments), every function, constant, callable
    object and first-party module it reads, recursively, and its clip bounds (not the label,
    which changes no run). The same in every process."""
    variant = resolve(name)
    out: list[str] = [repr(variant.bounds)]
    _describe(variant.loss, set(), out)
    return hashlib.sha256("\0".join(out).encode()).hexdigest()
