"""The rules for :func:`gmpo_core.gmpo_loss`'s options that need no tensor: the path names and
the hyper-parameter checks. Pure Python (no torch), so the adapters' configs and command-line
help check the same rules without loading torch; docs/semantics.md states them.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Literal

#: the log-space clip of the paper (e^±0.4): the default ``epsilon`` of the loss, its building
#: blocks, its reference and the adapters' configs
EPSILON = 0.4

Impl = Literal["plain", "compiled"]
#: ``impl`` values of :func:`gmpo_core.gmpo_loss`; the first is the default.
IMPLS: tuple[Impl, ...] = ("plain", "compiled")


def check_impl(impl: object, name: str = "impl") -> Impl:
    """``impl`` is one of :data:`IMPLS`; ``name`` is what the caller calls the option."""
    if impl not in IMPLS:
        raise ValueError(f"{name} must be 'plain' (the default) or 'compiled', got {impl!r}")
    return impl


def upper(epsilon: float, epsilon_high: float | None) -> float:
    """The upper clip bound: ``epsilon_high``, or ``epsilon`` where it is None."""
    return epsilon if epsilon_high is None else epsilon_high


def check_hyperparameters(
    epsilon: object,
    epsilon_high: object | None,
    dual_clip: object | None = None,
    *,
    names: tuple[str, str, str] = ("epsilon", "epsilon_high", "dual_clip"),
) -> tuple[float, float, float | None]:
    """Validate the clip range; return ``(eps_low, eps_high, log_dual_clip)``. ``names`` are
    what the caller calls the three options (an adapter's field names)."""
    eps_low = positive_finite(names[0], epsilon)
    high = None if epsilon_high is None else positive_finite(names[1], epsilon_high)
    eps_high = upper(eps_low, high)
    log_dual = None
    if dual_clip is not None:
        cap = as_float(dual_clip)
        if cap is None or not 1 < cap < math.inf:
            raise ValueError(
                f"{names[2]} must be a finite number > 1 (a cap on the ratio for negative "
                f"advantages), got {shown(names[2], dual_clip)}"
            )
        log_dual = math.log(cap)
    return eps_low, eps_high, log_dual


def check_beta(beta: object, has_ref_logp: bool) -> float:
    """``beta`` is a finite number >= 0, and not 0 only with the reference log-probs."""
    value = as_float(beta)
    if value is None or not 0 <= value < math.inf:
        raise ValueError(f"beta must be a finite number >= 0, got {shown('beta', beta)}")
    if value != 0 and not has_ref_logp:
        raise ValueError(f"beta={beta} needs ref_logp (the reference policy's log-probs), got None")
    return value


#: The largest |p| a power mean takes (docs/semantics.md S17). Its gradient is scaled by 1/p
#: and then by p, with 1/(p n) in between: at 3e38 even a row of one token takes that
#: below float32's normal range (1.2e-38); at 1e18, a row of 8e19 tokens would.
MAX_POWER = 1e18


def check_power(p: object, name: str = "p") -> float:
    """``p``, the exponent of a power mean, is a real number with ``|p| <= MAX_POWER``;
    return it as a float. A tensor is refused (not a real number to Python)."""
    value = as_float(p)
    if value is None or not -MAX_POWER <= value <= MAX_POWER:
        raise ValueError(
            f"{name} must be a finite number with |{name}| <= {MAX_POWER:g} (the exponent of the "
            f"power mean), got {shown(name, p)}"
        )
    return value


def shown(name: str, x: object) -> str:
    """``x`` as a refusal names it: its repr, but a NumPy array by its dimensions. Inside
    ``torch.compile`` Dynamo traces every NumPy scalar as a 0-d array, whose value (and so its
    repr) is unknown while tracing and no branch can read (docs/semantics.md S17): the message
    says what to pass instead."""
    ndim = getattr(x, "ndim", None)
    if type(x).__name__ == "ndarray" and isinstance(ndim, int):
        return (
            f"a {ndim}-d NumPy array (inside torch.compile a NumPy scalar is one, whose value is "
            f"unknown while tracing: pass float({name}))"
        )
    return repr(x)


def is_real(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def as_float(x: object) -> float | None:
    """``x`` as the float the loss computes with, or None where ``x`` is not a real number or
    no float holds it (an int past 1e308 raises OverflowError in ``float``). Every rule is
    checked on this float, not on ``x``: a ``numpy.longdouble`` of 1e400 is below ``inf`` but
    its float is ``inf``, and a ``Fraction`` just above 1 may be 1.0 as a float."""
    if type(x) is float:  # the common case, without the ABC check (a call is paid per use)
        return x
    if not is_real(x):
        return None
    try:
        return float(x)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):  # a Real whose __float__ fails
        return None


def positive_finite(name: str, x: object) -> float:
    # comparisons rather than math.isfinite: NaN fails them too, and they trace under dynamo
    value = as_float(x)
    if value is None or not 0 < value < math.inf:
        raise ValueError(
            f"{name} must be a finite number > 0 (a log-space bound), got {shown(name, x)}"
        )
    return value
