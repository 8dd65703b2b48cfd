"""The registry of loss variants: :func:`register` records a variant once, :func:`resolve` finds
it by name or as ``module:function``.

A *variant* is a policy loss with GMPO's inputs: ``loss(logp, old_logp, advantages, mask)`` on
``(B, T)``, ``(B, T)``, ``(B,)`` and ``(B, T)`` tensors, returning the loss to minimize (0-d) or
``(loss, clipped fraction)`` (both 0-d; the fraction of valid tokens whose gradient the clip
removed). Its record (:class:`Variant`) holds its label, its clip bounds in log space where it
clips tokens, its float64 reference counterpart and the extra it needs; the stability study,
``gmpo compare --variant``, ``GMPOConfig.loss_variant``, the reference tests and docs/recipes.md
read it from :data:`VARIANTS`. verl's ``register_policy_loss`` is the model; unlike it,
registering a *different* function under a taken name raises.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

LossFn = Callable[[Tensor, Tensor, Tensor, Tensor], Any]
#: a float64 counterpart: numpy arrays (logp, old_logp, advantages, mask) -> the loss value
ReferenceFn = Callable[[Any, Any, Any, Any], float]

SIGNATURE = "loss(logp, old_logp, advantages, mask) -> loss or (loss, clipped fraction), 0-d"


@dataclass(frozen=True)
class Variant:
    """A registered loss variant.

    ``name``: what ``--variant``, ``--methods`` and ``loss_variant`` take. ``label``: one line
    for tables and plots. ``loss``: the function (:data:`LossFn`). ``bounds``: ``(low, high)``,
    the log-space bounds of a token-level clip (it acts below ``-low`` where A < 0 and above
    ``high`` where A > 0), None for a variant without one. ``reference``: the independent
    float64 counterpart (numpy in, a float out), None where another test is its reference (a
    host's loss against the host's trainer). ``requires``: the extra that brings what it imports
    (``"verl"``), None for torch alone."""

    name: str
    label: str
    loss: LossFn
    bounds: tuple[float, float] | None = None
    reference: ReferenceFn | None = None
    requires: str | None = None

    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(loss, clipped fraction)``: a variant that returns the loss alone has a NaN clipped
        fraction (unknown). Anything else is a TypeError that names the expected signature.

        An empty batch (B = 0) has the loss 0, with an empty gradient, whatever the variant's
        mean over no rows gives (a ``Tensor.mean`` gives NaN): docs/semantics.md S4, for every
        variant, registered or ``module:function``."""
        loss, clipped = outputs(self.name, self.loss(logp, old_logp, advantages, mask))
        if advantages.shape[0] == 0:  # B = 0: a Python int, no read from the device
            loss = torch.where(torch.zeros_like(loss, dtype=torch.bool), loss, 0)
        return loss, clipped


def outputs(name: str, result: Any) -> tuple[Tensor, Tensor]:
    """A variant's return value as ``(loss, clipped fraction)``."""
    if isinstance(result, Tensor) and result.dim() == 0:
        return result, torch.full_like(result.detach(), math.nan)
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and all(isinstance(t, Tensor) and t.dim() == 0 for t in result)
    ):
        return result[0], result[1].detach()
    got = type(result).__name__
    if isinstance(result, Tensor):
        got = f"a tensor of shape {tuple(result.shape)}"
    elif isinstance(result, tuple):
        got = f"a tuple of {len(result)}"
    raise TypeError(f"variant {name!r} must be {SIGNATURE}; it returned {got}")


_REGISTRY: dict[str, Variant] = {}
_LOADED = False


def register(
    name: str,
    *,
    label: str,
    bounds: tuple[float, float] | None = None,
    reference: ReferenceFn | None = None,
    requires: str | None = None,
) -> Callable[[LossFn], LossFn]:
    """Decorator: record the function as the variant ``name`` and return it unchanged.

    Registering the same variant again is a no-op, and its module imported again replaces it;
    another function, or the same one with other settings, under a taken name is a
    ValueError."""

    def decorate(fn: LossFn) -> LossFn:
        variant = Variant(name, label, fn, bounds, reference, requires)
        taken = _REGISTRY.get(name)
        if taken is not None and taken != variant and not _reloaded(taken, variant):
            raise ValueError(
                f"variant {name!r} is already registered to {_name(taken.loss)}"
                + (" with other settings" if taken.loss is fn else "")
            )
        _REGISTRY[name] = variant
        return fn

    return decorate


#: the built-in modules in the order their variants are listed (GRPO first, the baseline)
FIRST = ("grpo", "gmpo", "ablations")


def _identity(fn: object) -> tuple[Any, ...]:
    """What names a loss from one import of its module to the next: its module and qualified
    name; for a ``functools.partial`` (a parameterised variant, one function registered at each
    of its settings), its function's, then its arguments."""
    if isinstance(fn, functools.partial):
        return (*_identity(fn.func)[:2], fn.args, tuple(sorted(fn.keywords.items())))
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)


def _name(fn: object) -> str:
    """A loss for a message: ``module.function``, with a partial's arguments."""
    module, qualname, *params = _identity(fn)
    if not params:
        return f"{module}.{qualname or fn}"
    args, keywords = params
    shown = [*map(repr, args), *(f"{key}={value!r}" for key, value in keywords)]
    return f"{module}.{qualname}({', '.join(shown)})"


def _reloaded(taken: Variant, new: Variant) -> bool:
    """Whether ``new`` is ``taken``'s function from its module imported again (a reload)."""
    a, b = taken.loss, new.loss
    return a is not b and None not in _identity(a)[:2] and _identity(a) == _identity(b)


def _load() -> None:
    """Import every module of this package once, :data:`FIRST` first: each registers its
    variants on import, so a new variant is one new file."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    package = __name__.rpartition(".")[0]
    path = importlib.import_module(package).__path__
    found = sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_"))
    for name in [*FIRST, *(m for m in found if m not in FIRST)]:
        importlib.import_module(f"{package}.{name}")


def _rank(variant: Variant) -> int:
    """The listing position of a variant's module: :data:`FIRST`'s, then the others'."""
    module = (_identity(variant.loss)[0] or "").rpartition(".")[2]
    return FIRST.index(module) if module in FIRST else len(FIRST)


class _Variants(Mapping[str, Variant]):
    """The registered variants by name, in registration order (read-only)."""

    def __getitem__(self, name: str) -> Variant:
        _load()
        return _REGISTRY[name]

    def __iter__(self) -> Iterator[str]:
        _load()
        return iter(sorted(_REGISTRY, key=lambda name: _rank(_REGISTRY[name])))

    def __len__(self) -> int:
        _load()
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"VARIANTS({', '.join(self)})"


VARIANTS: Mapping[str, Variant] = _Variants()


def resolve(spec: object) -> Variant:
    """The variant ``spec`` names: a key of :data:`VARIANTS`, or ``module:function`` (an
    importable module's :class:`Variant`, a registered function, or any function with the
    signature :data:`SIGNATURE`: it has no token clip bounds). Every failure is a ValueError of
    one line: a name that is not a string, an unknown name, a module that does not import
    (whatever it raises: a syntax error included), a missing attribute, one that is not
    callable."""
    if not isinstance(spec, str):
        raise ValueError(
            f"a variant is a name or module:function, got {type(spec).__name__} {spec!r}"
        )
    if spec in VARIANTS:
        return available(VARIANTS[spec])
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"unknown variant {spec!r}: choose from {', '.join(VARIANTS)} or give module:function"
        )
    try:
        obj = getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise ValueError(f"variant {spec!r}: module {module!r} has no {attr!r}") from None
    except ModuleNotFoundError as err:
        if err.name is not None and module.startswith(err.name):
            raise ValueError(f"variant {spec!r}: no module {err.name!r} found") from None
        raise ValueError(f"variant {spec!r}: importing {module!r} failed: {_line(err)}") from None
    except Exception as err:  # the user's module raised while importing, or does not parse
        raise ValueError(f"variant {spec!r}: importing {module!r} failed: {_line(err)}") from None
    if isinstance(obj, Variant):
        return obj
    for variant in VARIANTS.values():
        if variant.loss is obj:
            return variant
    if not callable(obj):
        raise ValueError(f"variant {spec!r} is {type(obj).__name__}, not a function: {SIGNATURE}")
    return Variant(spec, spec, obj)


def available(variant: Variant) -> Variant:
    """``variant``, once what it ``requires`` is importable; else a ValueError of one line that
    names the extra to install."""
    if variant.requires is not None and importlib.util.find_spec(variant.requires) is None:
        raise ValueError(
            f"variant {variant.name!r} calls {variant.requires}'s own code, and {variant.requires} "
            f"is not installed: pip install -e '.[{variant.requires}]' in the gmpo clone"
        )
    return variant


def _line(err: BaseException) -> str:
    """An exception in one line: its type and the first line of its message (with a syntax
    error's file and line)."""
    text = str(err).splitlines()[0] if str(err) else ""
    if isinstance(err, SyntaxError) and err.filename:
        text = f"{err.msg} ({err.filename}, line {err.lineno})"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
