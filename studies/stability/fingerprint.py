"""The fingerprint of a variant's definition, under which the stability study caches its runs:
after any change to a variant, a rerun recomputes its runs instead of reusing them.

:func:`fingerprint` reads what defines the variant's loss: its source, its defaults, closure and
``functools.partial`` arguments, and, recursively, every function, constant, object, class (the
source of each first-party class of its MRO and of the functions in it) and first-party module
(its whole source) it reads through its globals or imports in its body, a bound method's
function and object; and the variant's clip bounds (the study's clip metrics read them). A
library's function (gmpo_core, whose source the run's code fingerprint covers, torch, numpy,
the standard library, installed packages) is named, not read, but for the package the variant
``requires`` (verl, for the hosts' losses): its version and the code the variant reaches in it
are read. Nothing read is a memory address: the same in every process.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
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
_METHODS = (staticmethod, classmethod)


class _Reader:
    """What defines the objects :meth:`add` is given, as strings (:attr:`out`). ``read``: the
    installed packages whose code is read, not named."""

    def __init__(self, read: tuple[str, ...] = ()) -> None:
        self.out: list[str] = []
        self.read = read
        self._seen: set[int] = set()
        self._alive: list[Any] = []  # what _seen holds the id of: no id is reused meanwhile

    def library(self, module: str, path: str) -> bool:
        """Whether code of ``module`` (its file ``path``) is a library's: named, not read."""
        top = module.split(".")[0]
        if top in self.read:
            return False
        return top in _NAMED or top in sys.stdlib_module_names or "-packages" in path or not path

    def first(self, obj: Any) -> bool:
        """Whether ``obj`` is met for the first time (then it is remembered)."""
        if id(obj) in self._seen:
            return False
        self._seen.add(id(obj))
        self._alive.append(obj)
        return True

    def add(self, obj: Any) -> None:
        """Append what defines ``obj``."""
        out = self.out
        if isinstance(obj, _PLAIN):
            out.append(repr(obj))
        elif isinstance(obj, tuple | list | set | frozenset | dict):
            self.container(obj)
        elif isinstance(obj, functools.partial):
            out.append("partial")
            for part in (obj.func, obj.args, obj.keywords):
                self.add(part)
        elif isinstance(obj, types.MethodType):  # a bound method: its function and its object
            out.append("method")
            self.add(obj.__func__)
            self.add(obj.__self__)
        elif isinstance(obj, types.FunctionType):
            self.function(obj)
        elif isinstance(obj, types.ModuleType):  # read through an attribute: helpers.loss(...)
            path = getattr(obj, "__file__", None) or ""
            out.append(obj.__name__)
            if not self.library(obj.__name__, path) and self.first(obj):
                out.append(Path(path).read_text(encoding="utf-8"))
        elif isinstance(obj, type):
            self.cls(obj)
        elif isinstance(obj, types.BuiltinFunctionType):
            out.append(f"{obj.__module__}.{obj.__qualname__}")
        elif callable(getattr(obj, "__wrapped__", None)):  # lru_cache: the function it wraps
            out.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
            self.add(obj.__wrapped__)
        elif self.is_read(type(obj)) or (callable(obj) and hasattr(obj, "__dict__")):
            self.instance(obj)
        else:  # a library's constant (a tensor, a dtype...): its repr, without addresses
            out.append(f"{type(obj).__qualname__}:{_ADDRESS.sub('', repr(obj))}")

    def container(self, obj: tuple | list | set | frozenset | dict) -> None:
        """A container's items, each described; a set's and a dict's in the order of their
        descriptions (a set of strings iterates in another order in every process)."""
        self.out.append(type(obj).__name__)
        if isinstance(obj, tuple | list) and all(isinstance(x, _PLAIN) for x in obj):
            self.out.append(repr(obj))
        elif not self.first(obj):
            return
        elif isinstance(obj, dict):
            self.unordered([(k, v) for k, v in obj.items()])
        elif isinstance(obj, set | frozenset):
            self.unordered([(x,) for x in obj])
        else:
            for x in obj:
                self.add(x)

    def unordered(self, items: list[tuple[Any, ...]]) -> None:
        """Items described in the order of their descriptions, each as if met first (what it
        shares with another item is described in both, whichever comes first)."""
        before, after, texts = self._seen, set(self._seen), []
        for item in items:
            self._seen = set(before)
            texts.append(self.apart(*item))
            after |= self._seen
        self._seen = after
        self.out += sorted(texts)

    def apart(self, *objs: Any) -> str:
        """What defines ``objs``, as one string (not appended)."""
        out, self.out = self.out, []
        for obj in objs:
            self.add(obj)
        text, self.out = "\0".join(self.out), out
        return text

    def function(self, fn: types.FunctionType) -> None:
        """A function's source (its code where there is none: a dataclass's ``__init__``),
        defaults, closure, and what it reads through its globals or imports in its body."""
        self.out.append(f"{fn.__module__}.{fn.__qualname__}")
        if self.library(fn.__module__, fn.__code__.co_filename) or not self.first(fn):
            return
        try:
            self.out.append(inspect.getsource(fn))
        except (OSError, TypeError):
            self.out.append(self.apart(_code(fn.__code__)))
        self.add(fn.__defaults__)
        self.add(fn.__kwdefaults__)
        for cell in fn.__closure__ or ():
            self.add(cell.cell_contents)
        for name in _names(fn.__code__):
            if name in fn.__globals__:
                self.out.append(name)
                self.add(fn.__globals__[name])
        for module, names in _imports(fn.__code__, fn.__globals__.get("__package__")):
            self.imported(module, names)

    def imported(self, module: str, names: tuple[str, ...] | None) -> None:
        """What ``from module import names`` (``import module``: ``names`` None) in a function's
        body brings: a library's module is named, without importing it."""
        self.out.append(f"import {module} {names!r}")
        top = module.split(".")[0]
        if top in sys.modules:
            path = getattr(sys.modules[top], "__file__", None) or ""
        else:  # found, not imported: a library is not imported here
            spec = importlib.util.find_spec(top)
            path = "" if spec is None else spec.origin or ""
        if self.library(module, path):
            return
        mod = importlib.import_module(module)
        for name in names or ():
            if not hasattr(mod, name):  # a submodule not imported yet
                importlib.import_module(f"{module}.{name}")
            self.add(getattr(mod, name))
        if names is None:
            self.add(mod)

    def is_read(self, cls: type) -> bool:
        """Whether ``cls`` is a class whose source is read (not a library's)."""
        module = sys.modules.get(cls.__module__)
        return not self.library(cls.__module__, getattr(module, "__file__", None) or "")

    def cls(self, cls: type) -> None:
        """A class's name and, for each class of its MRO that is read, its source and what
        defines its attributes (the functions its methods and properties run, recursively)."""
        self.out.append(f"{cls.__module__}.{cls.__qualname__}")
        for base in cls.__mro__:
            if self.is_read(base) and self.first(base):
                self.members(base)

    def members(self, cls: type) -> None:
        self.out.append(cls.__qualname__)
        try:
            self.out.append(inspect.getsource(cls))
        except (OSError, TypeError):  # a class made by a call (namedtuple): its members alone
            pass
        for name, attr in vars(cls).items():
            if isinstance(attr, _METHODS):
                attr = attr.__func__
            if isinstance(attr, property):
                self.out.append(name)
                for fn in (attr.fget, attr.fset, attr.fdel):
                    self.add(fn)
            elif isinstance(attr, types.FunctionType) or not name.startswith("__"):
                self.out.append(name)
                self.add(attr)

    def instance(self, obj: Any) -> None:
        """An object of a class that is read, or a callable object: its class and its state
        (its attributes, each described, not repr'd: no addresses)."""
        self.cls(type(obj))
        if not self.first(obj):
            return
        state = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                state[slot] = getattr(obj, slot)
        for key in sorted(state):
            self.out.append(key)
            self.add(state[key])


def _code(code: types.CodeType) -> tuple[Any, ...]:
    """A code object as plain values: its bytecode, constants (nested code objects alike) and
    names."""
    consts = tuple(_code(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.co_code, consts, code.co_names, code.co_varnames


def _nested(code: types.CodeType) -> list[types.CodeType]:
    """A code object and the code objects nested in it (lambdas, comprehensions, inner
    functions), recursively."""
    return [code, *(n for c in code.co_consts if isinstance(c, types.CodeType) for n in _nested(c))]


def _names(code: types.CodeType) -> list[str]:
    """The global names a code object and the code objects nested in it read."""
    return [n for c in _nested(code) for n in c.co_names]


def _imports(code: types.CodeType, package: str | None) -> list[tuple[str, tuple[str, ...] | None]]:
    """The imports in a function's body: ``(absolute module, names)``, names None for a plain
    ``import module``."""
    found = []
    for c in _nested(code):
        ops = list(dis.get_instructions(c))
        for i, op in enumerate(ops):
            if op.opname == "IMPORT_NAME" and i >= 2:
                level, names = ops[i - 2].argval, ops[i - 1].argval
                if level and not package:
                    continue
                name = importlib.util.resolve_name("." * level + op.argval, package)
                found.append((name.rstrip("."), names))
    return found


def fingerprint(name: str) -> str:
    """sha256 of the definition of ``resolve(name)``: its loss's source, its parameters
    (defaults, closure, ``functools.partial`` arguments), every function, constant, object,
    class and first-party module it reads, recursively, its clip bounds (not the label, which
    changes no run), and, for a variant that ``requires`` a package, that package's version
    and what the variant runs of it (:func:`_host_code`). The same in every process."""
    variant = resolve(name)
    reader = _Reader()
    reader.out.append(repr(variant.bounds))
    reader.add(variant.loss)
    if variant.requires is not None:
        reader.out.append(f"{variant.requires} {_version(variant.requires)}")
        reader.read = (variant.requires,)
        reader.add(_host_code(variant.name))
    return hashlib.sha256("\0".join(reader.out).encode()).hexdigest()


def _host_code(name: str) -> tuple[Any, str]:
    """What the host's variant ``name`` (``gmpo_variants.hosts``) runs of verl's code: the
    policy loss verl registers under its ``loss_mode``, and the settings it runs with (verl's
    ``ActorConfig``, every field at its value: verl's defaults too), but the per-call batch
    description that ``call_host`` rewrites."""
    from gmpo_variants.hosts import host_loss

    fn, config = host_loss(name)
    fields = {k: v for k, v in vars(config).items() if k != "global_batch_info"}
    return fn, _ADDRESS.sub("", repr(fields))


def _version(package: str) -> str:
    """The installed version of the distribution of ``package``'s name, else of those that
    bring it."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        dists = importlib.metadata.packages_distributions().get(package, [])
        return ",".join(f"{d} {importlib.metadata.version(d)}" for d in sorted(dists))
