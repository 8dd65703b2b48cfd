"""The stability study's policy losses, each a few lines on ``gmpo_core``'s public API.

A method maps ``(logp, old_logp, advantages, mask)`` -- (B, T), (B, T), (B,), (B, T) -- to the
loss to minimize (0-d) and the fraction of valid tokens whose gradient the clip removed (0-d,
detached). To study a variant, write such a function and add it to :data:`METHODS` (its runs are
cached under :func:`fingerprint` of its definition: after a change, a rerun recomputes them);
e.g. GMPO with an asymmetric clip range::

    METHODS["gmpo_asym"] = Method(
        "GMPO, log-ratio clip (-0.2, 0.4)",
        lambda lp, old, a, m: gmpo_method(lp, old, a, m, epsilon=0.2, epsilon_high=0.4),
    )
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import sys
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gmpo_core import clip_metrics, gmpo_loss, masked_geometric_mean, trust_region_log_ratio

LossFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class Method(NamedTuple):
    label: str
    loss: LossFn


def clipped_fraction(
    r: Tensor, advantages: Tensor, mask: Tensor, epsilon: float, epsilon_high: float
) -> Tensor:
    """Fraction of valid tokens the one-sided clip (log-space bounds) zeroes the gradient of."""
    stats = clip_metrics(r, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high)
    clipped = stats.num_clipped_low + stats.num_clipped_high
    return (clipped / stats.num_tokens.clamp(min=1)).float()


def grpo_method(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """TRL's ``loss_type="grpo"`` (no KL, no ``delta``): PPO's clipped surrogate per token in
    ratio space, ``-min(rho A, clip(rho, 1 - eps, 1 + eps_h) A)``, a token mean per row, then
    the mean over rows. ``tests/trl/test_stability_grpo.py`` checks it against TRL's loss step."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    valid = mask != 0  # (B, T)
    a = advantages[:, None]  # (B, 1)
    rho = torch.exp(torch.where(valid, logp - old_logp, 0))  # (B, T)
    per_token = -torch.minimum(rho * a, rho.clamp(1 - epsilon, 1 + eps_high) * a)  # (B, T)
    per_row = torch.where(valid, per_token, 0).sum(-1) / valid.sum(-1).clamp(min=1)  # (B,)
    low, high = -math.log(1 - epsilon), math.log1p(eps_high)  # the same bounds in log space
    return per_row.mean(), clipped_fraction(logp - old_logp, advantages, mask, low, high)


def gmpo_method(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, **clip: Any
) -> tuple[Tensor, Tensor]:
    """GMPO (``gmpo_core.gmpo_loss``, whose keyword arguments ``clip`` are: ``epsilon`` 0.4 by
    default, ``epsilon_high``): token clip in log space, then the geometric mean."""
    out = gmpo_loss(logp, old_logp, advantages, mask, **clip)
    return out.loss, out.metrics["clip_ratio/region_mean"].float()


def _policy_loss(advantages: Tensor, log_coef: Tensor, valid: Tensor) -> Tensor:
    """mean_i of -A_i exp(log_coef_i); rows with A = 0 or no valid token give exactly 0."""
    active = (advantages != 0) & valid.any(-1)  # (B,)
    per_row = -advantages * torch.exp(torch.where(active, log_coef, 0))  # (B,)
    return torch.where(active, per_row, 0).mean()


def gmpo_noclip_method(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """The geometric mean of the unclipped ratios (the paper's no-clip ablation)."""
    valid = mask != 0
    r = torch.where(valid, logp - old_logp, 0)  # (B, T)
    log_coef = masked_geometric_mean(r, valid)  # (B,)
    return _policy_loss(advantages, log_coef, valid), r.new_zeros(())


def gmpo_seqclip_method(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, epsilon: float = 0.4
) -> tuple[Tensor, Tensor]:
    """The paper's sequence-level clip (docs/recipes.md section 2): the row's mean log-ratio goes
    through the trust region; the clipped fraction counts the tokens of clipped rows."""
    valid = mask != 0
    r = torch.where(valid, logp - old_logp, 0)  # (B, T)
    s = masked_geometric_mean(r, valid)  # (B,)
    log_coef = trust_region_log_ratio(s, advantages, epsilon=epsilon)  # (B,)
    row_clipped = ((advantages > 0) & (s > epsilon)) | ((advantages < 0) & (s < -epsilon))
    tokens = valid.sum(-1)  # (B,)
    frac = torch.where(row_clipped, tokens, 0).sum() / tokens.sum().clamp(min=1)
    return _policy_loss(advantages, log_coef, valid), frac.detach().float()


WIDE = 0.4  # GMPO's log-space epsilon, and grpo_wide's ratio range (e^-0.4, e^0.4)

METHODS: dict[str, Method] = {
    "grpo": Method("GRPO, ratio clip 1 ± 0.2", grpo_method),
    "grpo_wide": Method(
        "GRPO, ratio clip (e^-0.4, e^0.4)",
        lambda lp, old, a, m: grpo_method(
            lp, old, a, m, epsilon=-math.expm1(-WIDE), epsilon_high=math.expm1(WIDE)
        ),
    ),
    "gmpo": Method("GMPO, log-ratio clip ± 0.4", gmpo_method),
    "gmpo_narrow": Method(
        "GMPO, log-ratio clip ± 0.2", lambda lp, old, a, m: gmpo_method(lp, old, a, m, epsilon=0.2)
    ),
    "gmpo_noclip": Method("GMPO without clip", gmpo_noclip_method),
    "gmpo_seqclip": Method("GMPO, sequence-level clip ± 0.4", gmpo_seqclip_method),
}


_PLAIN = (int, float, complex, str, bytes, bool, type(None))
#: libraries whose functions a fingerprint names rather than reads (gmpo_core's source is in
#: ``_study_run.code_fingerprint``; torch's version too)
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
    """sha256 of the definition of ``METHODS[name]``'s loss: its source, its parameters
    (defaults, closure, ``functools.partial`` arguments) and every function and constant it
    reads, recursively (not the label, which changes no run). The same in every process."""
    out: list[str] = []
    _describe(METHODS[name].loss, set(), out)
    return hashlib.sha256("\0".join(out).encode()).hexdigest()
