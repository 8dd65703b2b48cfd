"""The fused fast path: one forward kernel, one backward kernel, both compiled.

The forward reduces each row in one pass (loss terms, clip counts, extrema) and saves nothing but
its inputs and two (B,) vectors. The backward recomputes the clip indicator from ``logp`` and
``old_logp`` and writes the gradient in one pass::

    d loss / d logp_t = valid_t * [ u_t * (g_lc_i + g_i * policy_i) / n_i
                                    - g_i * beta / n_i * expm1(ref_logp_t - logp_t) ]

where ``u_t`` is 1 unless the trust region clipped the token, ``g_i`` is the upstream gradient
of ``per_sequence_loss_i`` plus that of ``loss`` over B (``loss`` is their mean, computed in the
same kernel), ``g_lc_i`` the upstream gradient of ``log_coef_i``, and ``policy_i`` the row's
policy term (its own derivative with respect to ``log_coef``). So a forward+backward reads logp,
old_logp and the mask twice and writes the gradient once: close to the memory-bandwidth bound.

The kernels are plain tensor functions; :func:`compile_kernels` wraps them in ``torch.compile``
(dynamic shapes, full graph). ``impl="auto"`` falls back to running them eagerly, with one
warning, where compilation fails.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from gmpo_core.loss import GMPOOutput, compute, compute_dtype
from gmpo_core.ops import ClipStats, _row_bounds, _rows, _valid, metric_vector


def _forward_kernel(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    w_row: Tensor | None,
    params: Tensor,
) -> tuple[Tensor | None, ...]:
    """Every row-level quantity in one pass over the (B, T) inputs, and the metrics."""
    eps_low, eps_high, log_dual, beta = params.unbind()
    per_seq, log_coef, policy, n, stats, kl_rows = compute(
        logp, old_logp, adv, mask, ref_logp, w_tok, w_row,
        eps_low, eps_high, log_dual, beta, params.dtype,
    )  # fmt: skip
    kl_sum = per_seq.new_zeros(()) if kl_rows is None else kl_rows.sum()
    metrics = metric_vector(stats, kl_sum)
    return (per_seq.mean(), per_seq, log_coef, policy, n, *stats, kl_sum, metrics)


def _backward_kernel(
    grad_loss: Tensor,
    grad_ps: Tensor,
    grad_lc: Tensor,
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    policy: Tensor,
    n: Tensor,
    params: Tensor,
) -> Tensor:
    """The gradient with respect to ``logp`` in one pass (formula in the module docstring)."""
    eps_low, eps_high, log_dual, beta = params.unbind()
    cdt = params.dtype
    valid = _valid(mask, w_tok)
    lp = logp.to(cdt)
    r = lp - old_logp.to(cdt)  # (B, T); NaN at invalid positions is selected away below
    lo, hi = _row_bounds(adv.to(cdt), eps_low, eps_high, log_dual)
    unclipped = (r >= _rows(lo, r)) & (r <= _rows(hi, r))  # where clamp passes the gradient
    nf = n.clamp(min=1).to(cdt)  # (B,)
    grad_ps = grad_ps + grad_loss / grad_ps.shape[0]  # loss = mean of per_sequence_loss
    grad = torch.where(valid & unclipped, _rows((grad_lc + grad_ps * policy) / nf, r), 0)
    if ref_logp is not None:
        kl_scale = _rows(grad_ps * beta / nf, r)  # (B, 1)
        grad = grad - torch.where(valid, torch.expm1(ref_logp.to(cdt) - lp) * kl_scale, 0)
    return grad.to(logp.dtype)


class Kernels(NamedTuple):
    forward: Callable[..., tuple[Tensor | None, ...]]
    backward: Callable[..., Tensor]
    compiled: bool


EAGER_KERNELS = Kernels(_forward_kernel, _backward_kernel, compiled=False)


def compile_kernels(backend: Any = "inductor") -> Kernels:
    """The two kernels under ``torch.compile(dynamic=True, fullgraph=True)``."""
    compile_ = functools.partial(torch.compile, dynamic=True, fullgraph=True, backend=backend)
    return Kernels(compile_(_forward_kernel), compile_(_backward_kernel), compiled=True)


_default_kernels: Kernels | None = None


def default_kernels() -> Kernels:
    """The process-wide compiled kernels (created on first use; compilation is lazy)."""
    global _default_kernels
    if _default_kernels is None:
        _default_kernels = compile_kernels()
    return _default_kernels


def _run(kernels: Kernels, strict: bool, which: str, *args: Any) -> Any:
    """Call a kernel; if compilation fails, error out (strict) or fall back once, with a warning."""
    global _default_kernels
    fn = getattr(kernels, which)
    if not kernels.compiled:
        return fn(*args)
    try:
        return fn(*args)
    except Exception as e:
        if strict:
            raise RuntimeError(
                f"gmpo_loss(impl='compiled'): torch.compile failed on this platform "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                "Use impl='eager', or impl='auto' to fall back automatically."
            ) from e
        if _default_kernels is not EAGER_KERNELS:  # warn once per process
            warnings.warn(
                f"gmpo_core: torch.compile failed ({type(e).__name__}); running the fused GMPO "
                "kernels eagerly from now on in this process. Pass impl='eager' to silence this.",
                RuntimeWarning,
                stacklevel=4,
            )
        _default_kernels = EAGER_KERNELS
        return getattr(EAGER_KERNELS, which)(*args)


@functools.lru_cache(maxsize=64)
def _params(
    eps_low: float, eps_high: float, log_dual: float | None, beta: float, dtype: torch.dtype,
    device: torch.device,
) -> Tensor:  # fmt: skip
    """Hyperparameters as one small tensor, cached so that the hot path never copies them to the
    device again, and so that new values never trigger a recompilation."""
    dual = float("inf") if log_dual is None else log_dual
    return torch.tensor([eps_low, eps_high, dual, beta], dtype=dtype, device=device)


class _FusedGMPO(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logp: Tensor,
        old_logp: Tensor,
        adv: Tensor,
        mask: Tensor,
        ref_logp: Tensor | None,
        w_tok: Tensor | None,
        w_row: Tensor | None,
        params: Tensor,
        kernels: Kernels,
        strict: bool,
    ) -> tuple[Tensor, ...]:
        out = _run(
            kernels, strict, "forward", logp, old_logp, adv, mask, ref_logp, w_tok, w_row, params
        )
        loss, per_seq, log_coef, policy, n, *rest = out
        ctx.save_for_backward(logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params)
        ctx.kernels, ctx.strict = kernels, strict
        ctx.mark_non_differentiable(*[t for t in rest if t is not None])
        return (loss, per_seq, log_coef, *rest)

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_loss: Tensor, grad_ps: Tensor, grad_lc: Tensor, *_: Any
    ) -> tuple[Tensor | None, ...]:
        logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params = ctx.saved_tensors
        grad = None
        if ctx.needs_input_grad[0]:
            grad = _run(
                ctx.kernels, ctx.strict, "backward",
                grad_loss, grad_ps, grad_lc, logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params,
            )  # fmt: skip
        return (grad,) + (None,) * 9


def fused_gmpo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    w_row: Tensor | None,
    eps_low: float,
    eps_high: float,
    log_dual: float | None,
    beta: float,
    *,
    strict: bool = False,
    kernels: Kernels | None = None,
) -> GMPOOutput:
    """Validated inputs in, :class:`gmpo_core.GMPOOutput` out (called by ``gmpo_loss``)."""
    if kernels is None:
        # A dimension of size 1 would cost a recompilation (0/1 specialization) for a call too
        # small to benefit from compilation: run the same kernels eagerly instead.
        kernels = default_kernels() if min(logp.shape) > 1 else EAGER_KERNELS
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # zero-copy; see ops._valid
    params = _params(eps_low, eps_high, log_dual, beta, compute_dtype(logp.dtype), logp.device)
    loss, per_seq, log_coef, *rest = _FusedGMPO.apply(  # type: ignore[no-untyped-call]
        logp, old_logp, advantages.detach(), mask, ref_logp, w_tok, w_row, params, kernels, strict
    )
    *stats, kl_sum, metrics = rest
    if log_dual is None:
        stats[3] = None  # no dual clip: no dual count
    kl = None if ref_logp is None else kl_sum
    return GMPOOutput(loss, per_seq, log_coef, ClipStats(*stats), kl, metrics)
