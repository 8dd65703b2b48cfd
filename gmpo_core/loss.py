"""``gmpo_loss``: the GMPO objective (arXiv 2507.20673, Eq. 4), on the plain or the compiled path.

Both paths run the same math (:mod:`gmpo_core._math`); docs/semantics.md states every rule.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gmpo_core import _across, _agree, _checks, _math, _rows, compiled
from gmpo_core._counts import Tally
from gmpo_core.metrics import ClipStats
from gmpo_core.options import EPSILON, Impl, check_impl


@dataclass(frozen=True)
class GMPOOutput:
    """What :func:`gmpo_loss` returns.

    Shape:
        loss: (), float32 (float64 for float64 inputs). per_sequence_loss: (B,). log_coef: (B,).
        stats: counts and extrema (see :class:`gmpo_core.metrics.ClipStats`). kl_sum: () or None.
    """

    loss: Tensor
    per_sequence_loss: Tensor
    log_coef: Tensor
    _tally: Tally  # the statistics as two tensors, which ``stats`` and ``metrics`` read
    kl_sum: Tensor | None  # sum of the k3 estimator over valid tokens; None when beta == 0

    @property
    def stats(self) -> ClipStats:
        """Counts and extrema over the valid tokens (docs/semantics.md S10), made on each access
        (a few scalar operations; traceable by ``torch.compile``)."""
        return self._tally.stats()

    @property
    def metrics(self) -> Mapping[str, Tensor]:
        """The local metrics (docs/semantics.md, "Metrics") as 0-d detached tensors, computed on
        each access from the statistics (a few scalar operations; traceable by
        ``torch.compile``): the values ``stats.metrics(kl_sum)`` gives."""
        return self._tally.metrics(self.kl_sum)


def gmpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = EPSILON,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    is_weights: Tensor | None = None,
    dual_clip: float | None = None,
    impl: Impl = "plain",
    check_values: bool = False,
    cu_seqlens: Tensor | None = None,
    process_group: Any = None,
) -> GMPOOutput:
    """Geometric-Mean Policy Optimization loss (arXiv 2507.20673, Eq. 4), to minimize.

    Per row i, with ``r = logp - old_logp`` and ``n_i`` valid tokens::

        c_t        = min(r_t, eps_h) if A_i >= 0 else max(r_t, -eps_l)     (trust region, log space)
        log_coef_i = sum_t c_t / max(n_i, 1)                              (log geometric mean)
        loss_i     = -A_i * exp(log_coef_i) * w_i + beta * KL_i           (KL: token-mean k3)
        loss       = mean_i loss_i                                        (0 when B = 0)

    Empty rows and ``A_i = 0`` rows contribute exactly 0 to the policy term and its gradient;
    values at masked positions never matter. Gradients flow to ``logp`` only: ``old_logp``,
    ``advantages``, ``ref_logp`` and ``is_weights`` are constants of the loss. docs/semantics.md
    states every rule.

    Args:
        logp: log-probs of the sampled tokens under the current policy.
        old_logp: behaviour-policy log-probs; None means ``logp.detach()`` (on-policy).
        advantages: one advantage per sequence.
        mask: valid completion tokens (bool or 0/1).
        epsilon: log-space lower clip; the ratio lower bound is ``exp(-epsilon)``.
        epsilon_high: log-space upper clip; None means ``epsilon``.
        beta: weight of the sequence-level KL to the reference policy (needs ``ref_logp``).
        ref_logp: reference-policy log-probs.
        is_weights: rollout-correction weights. (B,) or (B, 1) multiply the row's policy term;
            (B, T) enter as their geometric mean over the row's valid tokens, and a token whose
            weight is 0 is removed from the row. (With T = 1, (B, 1) is read as a row weight.)
        dual_clip: optional cap ``c > 1`` on the ratio of negative-advantage tokens.
        impl: ``"plain"`` (default: plain PyTorch under autograd, no compilation) or
            ``"compiled"`` (one ``torch.compile``-d forward that also writes the gradient; it
            compiles on its first call; a second-order gradient differentiates the plain math,
            S14). Inside a user's ``torch.compile``, a ``torch.func`` transform or forward-mode
            AD both run the plain math under autograd.
        check_values: also check values (mask is 0/1, finite advantages, finite log-probs at
            valid positions, non-negative weights, and ``cu_seqlens`` from 0 to N,
            non-decreasing). This synchronizes with the device.
        cu_seqlens: packed input: ``(S + 1,)`` int32 or int64 segment boundaries
            (flash-attention's convention); row i is the tokens ``cu_seqlens[i]:cu_seqlens[i + 1]``
            of 1-D inputs. The result is the padded call's on the same rows; an empty segment is
            an empty row.
        process_group: the rows' tokens are split across the ranks of this
            ``torch.distributed`` process group (context or sequence parallelism): every rank
            passes its own tokens of the same rows (in the same order, with the same
            ``advantages``; a rank may hold no token of a row). Per-row sums are all-reduced
            before the exponential: every rank gets the whole rows' ``loss``, outputs and
            metrics, and the gradient of the whole rows' ``loss`` at its own tokens.

    Shape:
        padded: logp, old_logp, mask, ref_logp: (B, T). advantages: (B,). is_weights: (B,),
        (B, 1) or (B, T). packed (``cu_seqlens`` (S + 1,)): logp, old_logp, mask, ref_logp: (N,).
        advantages: (S,). is_weights: (N,) token weights or (S, 1) row weights. Output: see
        :class:`GMPOOutput` (B = S when packed).
    """
    x = _checks.Inputs(logp, old_logp, advantages, mask, ref_logp, is_weights)

    def validate() -> tuple[_math.Hyper, _math.Batch]:
        h = _checks.hyper(epsilon, epsilon_high, dual_clip, beta, ref_logp)
        _checks.check_inputs(x, cu_seqlens)
        check_impl(impl)
        if check_values:
            _checks.check_values(x, cu_seqlens)
        return h, _batch(x, h, cu_seqlens)

    if process_group is not None and check_values:  # every rank validates, then they agree
        call = _agree.Call(logp, old_logp is not None, impl, process_group)
        h, b = _agree.agree(validate, call)
    else:
        h, b = validate()
    across = None if process_group is None else _across.Across(process_group)
    if torch.compiler.is_compiling() or _transformed(b):
        # inside a user's torch.compile or a torch.func transform: the math under autograd
        fw = _math.forward(b, h, across=across)
        return GMPOOutput(fw.loss, fw.per_sequence_loss, fw.log_coef, fw.stats, fw.kl_sum)
    if impl == "compiled" and compiled.worth_compiling(logp, advantages):
        kernel, h = compiled.kernel(), compiled.hyper_tensors(h, logp)
    else:
        kernel = _math.forward
    with_grad = logp.requires_grad and torch.is_grad_enabled()  # a backward may come
    side = (across, with_grad)
    out = _GMPO.apply(b.logp, b, h, kernel, side)  # type: ignore[no-untyped-call]
    return GMPOOutput(*out)


def _batch(x: _checks.Inputs, h: _math.Hyper, cu_seqlens: Tensor | None) -> _math.Batch:
    """The validated inputs as the math layer's record: constants detached, ``old_logp`` None
    read as ``logp``, ``ref_logp`` only with a KL term, ``is_weights`` per token or per row."""
    logp, w, w_tok, w_row = x.logp, x.is_weights, None, None
    if w is not None:
        if w.shape == logp.shape and (cu_seqlens is not None or w.shape[1] != 1):
            w_tok = w.detach()  # (B, T) or (N,), T = 0 too; (B, 1) is a row weight
        else:
            w_row = w.detach().reshape(-1)
    return _math.Batch(
        logp=logp,
        old_logp=logp.detach() if x.old_logp is None else x.old_logp.detach(),
        adv=x.advantages.detach(),
        mask=_rows.constant(x.mask),  # only compared with 0: a tangent cannot reach the loss
        ref_logp=x.ref_logp.detach() if h.beta != 0 and x.ref_logp is not None else None,
        w_tok=w_tok,
        w_row=w_row,
        # int64 either way: one compiled kernel for int32 and int64 boundaries
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.detach().to(torch.int64),
    )


def _transformed(b: _math.Batch) -> bool:
    """Whether a ``torch.func`` transform (grad, vmap, jacrev, ...) wraps any input, or ``logp``
    carries a forward-mode tangent (a ``torch.autograd.forward_ad`` dual tensor, as
    ``jacobian(..., strategy="forward-mode")`` makes): such calls run the math under autograd,
    which every transform and forward-mode AD support (the Function has no ``jvp``). Told by
    ``torch.func.debug_unwrap`` and ``torch.autograd.forward_ad.unpack_dual``, the public APIs
    that see them; a torch without ``debug_unwrap`` (2.4) runs ``torch.func`` calls through the
    Function, which torch's transforms refuse with an error."""
    if _rows.has_tangent(b.logp):
        return True
    unwrap = getattr(torch.func, "debug_unwrap", None)
    if unwrap is None:
        return False
    for t in b:
        if t is not None and unwrap(t, recurse=False) is not t:
            return True
    return False


class _GMPO(torch.autograd.Function):
    """:func:`gmpo_core._math.forward`, which writes the gradient of ``loss`` where a backward is
    coming; the backward scales it per row (not at all for ``loss.backward()`` on CPU). Where
    that does not serve (an upstream gradient on ``log_coef``, a second backward through a
    retained graph, or ``create_graph=True``), it differentiates the math itself, recomputed
    under autograd from the saved inputs."""

    @staticmethod
    def forward(
        ctx: Any,
        logp: Tensor,
        b: _math.Batch,
        h: _math.Hyper,
        kernel: Callable[..., _math.Forward],
        side: tuple[_across.Across | None, bool],
    ) -> tuple[Tensor, Tensor, Tensor, Tally, Tensor | None]:
        # ``logp`` (the one input with a gradient, ``b.logp``) is an argument; the constants of
        # the loss travel inside ``b``, not as arguments of their own: ``apply`` costs about a
        # microsecond per argument. They are saved for a recomputing backward all the same.
        across, with_grad = side
        fw = kernel(b, h, with_grad, across)
        ctx.save_for_backward(*b)
        ctx.h, ctx.dtype = h, logp.dtype
        # the recomputing backward reuses the reduced sums: no collective in a backward
        ctx.across = None if across is None else across._replace(totals=fw.totals)
        ctx.loss_grad = fw.loss_grad  # not an output: no reference cycle; used once
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        if fw.kl_sum is not None:
            ctx.mark_non_differentiable(fw.kl_sum)
        # the statistics are outputs too: a record (not a tensor, so not differentiated) and
        # the KL sum (marked non-differentiable)
        return fw.loss, fw.per_sequence_loss, fw.log_coef, fw.stats, fw.kl_sum

    @staticmethod
    def backward(
        ctx: Any, g_loss: Tensor | None, g_ps: Tensor | None, g_lc: Tensor | None, *_: Any
    ) -> tuple[Tensor | None, ...]:
        grad, ctx.loss_grad = ctx.loss_grad, None  # handed on, so autograd need not copy it
        nones = (None,) * _INPUTS_AFTER_LOGP
        if grad is None or g_lc is not None or torch.is_grad_enabled():
            # the saved tensors are read here only: a checkpoint unpacks each one once
            return (_autograd_grad(ctx, ctx.saved_tensors, (g_loss, g_ps, g_lc)), *nones)
        if g_ps is not None:  # d/d per_sequence_loss_i = B d/d loss for every row
            scale = _math.to_dtype(g_ps, grad.dtype) * max(len(g_ps), 1)
            scale = scale if g_loss is None else scale + _math.to_dtype(g_loss, grad.dtype)
            cu_seqlens = ctx.saved_tensors[-1]
            seg = None if cu_seqlens is None else _rows.segments(cu_seqlens, grad.shape[0])
            scale = _rows.to_tokens(scale, seg)
        elif g_loss is None:
            return (_math.to_dtype(grad.zero_(), ctx.dtype), *nones)
        else:
            scale = _math.to_dtype(g_loss, grad.dtype)
        try:  # in place; loss.backward() on CPU (an upstream gradient of 1) skips the multiply
            if g_ps is not None or scale.device.type != "cpu" or scale.item() != 1.0:
                grad.mul_(scale)
        except RuntimeError:  # a batched upstream gradient (vmap, is_grads_batched) refuses
            grad = grad * scale  # in-place writes and host reads, before touching ``grad``
        return (_math.to_dtype(grad, ctx.dtype), *nones)


#: the Function's inputs after ``logp``, none of which gets a gradient
_INPUTS_AFTER_LOGP = len(inspect.signature(_GMPO.forward).parameters) - 2  # not ctx, logp


def _autograd_grad(
    ctx: Any, inputs: tuple[Tensor, ...], grads: tuple[Tensor | None, ...]
) -> Tensor | None:
    """The gradient by autograd: :func:`gmpo_core._math.forward` recomputed under autograd on
    the saved inputs (``logp`` keeps its history) and differentiated for the upstream
    ``grads`` of ``(loss, per_sequence_loss, log_coef)``, with a graph of its own where
    ``create_graph=True`` asked for one."""
    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        logp = inputs[0] if create_graph else inputs[0].detach().requires_grad_()
        fw = _math.forward(_math.Batch(logp, *inputs[1:]), ctx.h, across=ctx.across)
        pairs = [(o, g) for o, g in zip(fw[:3], grads, strict=True) if g is not None]
        if not pairs:
            return None
        (grad,) = torch.autograd.grad(
            [o for o, _ in pairs], logp, [g for _, g in pairs], create_graph=create_graph
        )
    return grad
