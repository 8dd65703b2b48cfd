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

Where a backward is coming (``logp`` requires grad, full precision), the forward kernel also
writes the gradient of ``loss`` right after its row sums, while the inputs are still in cache.
Every row's gradient is proportional to ``g_i``, so unless ``log_coef`` gets an upstream
gradient, the backward only scales it per row (not at all for ``loss.backward()`` on CPU) and
the backward kernel does not run.

On CPU, in float32, without the KL term or per-token weights, a hand-written kernel
(:mod:`gmpo_core._onepass`) replaces the compiled forward where it writes the gradient: it runs
the same steps one row at a time, so that each row is read from memory once.

The kernels are plain tensor functions. :func:`compile_kernels` compiles them with Inductor for
symbolic sizes and calls the generated code directly, without Dynamo's per-call work
(:class:`_Direct`; ``torch.compile(dynamic=True, fullgraph=True)`` where that is not possible).
The statistics leave the autograd function outside its outputs, so autograd tracks three tensors.
``impl="auto"`` falls back to running the kernels eagerly, with one warning, where compilation
fails.
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from gmpo_core._onepass import OnePass
from gmpo_core.loss import GMPOOutput, compute, compute_dtype
from gmpo_core.ops import ClipStats, _row_bounds, _rows, _valid, metric_vector

_log = logging.getLogger(__name__)


def _unpack(params: Tensor, dual: bool) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """eps_low, eps_high, log dual_clip (None without a dual clip: one clip count per row), beta.
    Indexing, not ``unbind``: the kernels are traced with a symbolic size for ``params`` too."""
    return params[0], params[1], params[2] if dual else None, params[3]


def _forward_kernel(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    w_row: Tensor | None,
    params: Tensor,
    dual: bool,
    speculate: bool,
) -> tuple[Tensor | None, ...]:
    """Every row-level quantity in one pass over the (B, T) inputs, and the metrics. With
    ``speculate``, also the gradient of ``loss`` with respect to ``logp`` (its last output): a row's
    gradient needs only that row's sums, so it is written while the row is still in cache."""
    eps_low, eps_high, log_dual, beta = _unpack(params, dual)
    per_seq, log_coef, policy, n, stats, kl_rows = compute(
        logp, old_logp, adv, mask, ref_logp, w_tok, w_row,
        eps_low, eps_high, log_dual, beta, params.dtype,
    )  # fmt: skip
    kl_sum = per_seq.new_zeros(()) if kl_rows is None else kl_rows.sum()
    metrics = metric_vector(stats, kl_sum)
    out = (per_seq.mean(), per_seq, log_coef, policy, n, *stats, kl_sum, metrics)
    if not speculate:
        return out
    g = per_seq.new_ones(()) / per_seq.shape[0]  # d loss / d per_sequence_loss_i
    grad = _logp_grad(g, None, logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params, dual)
    return (*out, grad)


def _logp_grad(
    g: Tensor,
    g_lc: Tensor | None,
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    w_tok: Tensor | None,
    policy: Tensor,
    n: Tensor,
    params: Tensor,
    dual: bool,
) -> Tensor:
    """The gradient with respect to ``logp`` (formula in the module docstring) given ``g``, the
    upstream gradient of each row's ``per_sequence_loss`` (or one for all rows), and ``g_lc``,
    that of ``log_coef`` (None: zero)."""
    eps_low, eps_high, log_dual, beta = _unpack(params, dual)
    cdt = params.dtype
    valid = _valid(mask, w_tok)
    lp = logp.to(cdt)
    r = lp - old_logp.to(cdt)  # (B, T); NaN at invalid positions is selected away below
    lo, hi = _row_bounds(adv.to(cdt), eps_low, eps_high, log_dual)
    unclipped = (r >= _rows(lo, r)) & (r <= _rows(hi, r))  # where clamp passes the gradient
    nf = n.clamp(min=1).to(cdt)  # (B,)
    coef = g * policy if g_lc is None else g_lc + g * policy
    grad = torch.where(valid & unclipped, _rows(coef / nf, r), 0)
    if ref_logp is not None:
        kl_scale = _rows(g * beta / nf, r)  # (B, 1)
        grad = grad - torch.where(valid, torch.expm1(ref_logp.to(cdt) - lp) * kl_scale, 0)
    return grad.to(logp.dtype)


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
    dual: bool,
) -> Tensor:
    """The gradient with respect to ``logp`` in one pass, from any upstream gradients."""
    g = grad_ps + grad_loss / grad_ps.shape[0]  # loss = mean of per_sequence_loss
    return _logp_grad(
        g, grad_lc, logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params, dual
    )


class Kernels(NamedTuple):
    forward: Callable[..., tuple[Tensor | None, ...]]
    backward: Callable[..., Tensor]
    compiled: bool
    # the hand-written one-pass CPU forward where it applies (see gmpo_core._onepass)
    onepass: OnePass | None = None


EAGER_KERNELS = Kernels(_forward_kernel, _backward_kernel, compiled=False)

_MAX_VARIANTS = 8  # compilations per input signature before the torch.compile fallback
# Inductor picks serial or parallel (OpenMP) code from the sizes of the call it compiles for, so
# calls below and above this many tokens never share a compiled variant: a first call on a tiny
# batch must not leave the large ones serial.
_LARGE_TOKENS = 1 << 16


class _Direct:
    """``fn`` compiled by Inductor for symbolic sizes and called without Dynamo.

    A kernel call through ``torch.compile`` spends 30-50 us in Dynamo's frame evaluation, guards
    and AOTAutograd's runtime wrappers, more than the kernel itself below ~2^17 tokens. The
    kernels need little of it: the autograd graph is ours (:class:`_FusedGMPO`), the inputs are
    validated, and what the compiled code may assume is known: its signature (dtypes, devices,
    ranks, which optional inputs are present, the Python arguments: the cache key) and the size
    guards that tracing and Inductor recorded (say, "T <= 4096" for its choice of summation),
    plus the size class (:data:`_LARGE_TOKENS`), which are checked on every call as one small
    Python function of (B, T). So the kernel is traced with ``make_fx`` (symbolic sizes,
    Inductor's decompositions, the first call's sizes as hints) and handed to Inductor's
    ``compile_fx_inner``, which is what ``torch.compile`` does after Dynamo and AOTAutograd; sizes
    that fail a variant's guards get a new variant. Those are PyTorch internals: if this fails on
    an installed version, or a guard reads anything but B and T, the kernel goes through
    ``torch.compile(dynamic=True, fullgraph=True)`` instead (``fallback``), so the speed may
    change but not the result.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.fallback = torch.compile(fn, dynamic=True, fullgraph=True)
        # per signature: (guard check of (B, T), compiled code) variants; None: use the fallback
        self.cache: dict[tuple[Any, ...], list[tuple[Callable[[int, int], bool], Any]] | None] = {}
        self.single = False  # fn returns one tensor, not a tuple (found when it is traced)
        self.static = list(inspect.signature(fn).parameters).index("params")  # size 4, fixed

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling():  # inside a user's torch.compile: let it trace fn
            return self.fn(*args)
        key = tuple((a.dtype, a.device, a.dim()) if isinstance(a, Tensor) else a for a in args)
        b, t = next(a.shape for a in args if isinstance(a, Tensor) and a.dim() == 2)
        variants = self.cache.setdefault(key, [])
        compiled = None
        if variants is not None:
            compiled = next((c for check, c in variants if check(b, t)), None)
            if compiled is None:
                variant = self._build(args, b, t) if len(variants) < _MAX_VARIANTS else None
                if variant is None:
                    self.cache[key] = None
                else:
                    variants.append(variant)
                    compiled = variant[1]
        if compiled is None:
            return self.fallback(*args)
        out = compiled([a.contiguous() for a in args if isinstance(a, Tensor)])
        return out[0] if self.single else tuple(out)

    def _build(
        self, args: tuple[Any, ...], b: int, t: int
    ) -> tuple[Callable[[int, int], bool], Any] | None:
        # the PyTorch internals are imported here: a missing one only disables the direct path
        try:
            import sympy
            from torch._inductor.compile_fx import compile_fx_inner
            from torch._inductor.decomposition import select_decomp_table
            from torch.fx.experimental.proxy_tensor import make_fx

            # Size hints: this call's, made distinct from each other and from len(params) = 4,
            # so that tracing gives B, T and len(params) three symbols (sizes that are equal at
            # trace time would share one).
            hint_b = b + (b == 4)
            hint_t = next(v for v in range(t, t + 3) if v not in (4, hint_b))

            def example(i: int, a: Tensor) -> Tensor:
                shape = a.shape if i == self.static else (hint_b, hint_t)[: a.dim()]
                return torch.empty(shape, dtype=a.dtype, device=a.device)  # never written

            def flat(*tensors: Tensor) -> tuple[Tensor | None, ...]:
                it = iter(tensors)
                out = self.fn(*(next(it) if isinstance(a, Tensor) else a for a in args))
                self.single = isinstance(out, Tensor)
                return (out,) if self.single else out  # Inductor compiles sequence outputs only

            tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, Tensor)]
            with torch.no_grad():
                gm = make_fx(
                    flat, tracing_mode="symbolic", decomposition_table=select_decomp_table()
                )(*(example(i, a) for i, a in tensors))
                fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
                compiled = compile_fx_inner(gm, fakes)
            by_index = dict(zip((i for i, _ in tensors), fakes, strict=True))
            matrix = next(f for f in fakes if f.dim() == 2)
            sizes = [s.node.expr for s in (*matrix.shape, by_index[self.static].shape[0])]
            if not all(isinstance(e, sympy.Symbol) for e in sizes):
                raise RuntimeError(f"sizes specialized in tracing: {sizes}")
            guards = [g.expr for g in fakes[0].fake_mode.shape_env.guards]
            extra = set().union(*(g.free_symbols for g in guards)) - set(sizes)
            if extra:
                raise RuntimeError(f"guards on other sizes than (B, T): {guards}")
            tokens = sizes[0] * sizes[1]  # the size class is one more guard
            guards.append(
                tokens >= _LARGE_TOKENS if b * t >= _LARGE_TOKENS else tokens < _LARGE_TOKENS
            )
            holds = sympy.lambdify(sizes, sympy.And(*guards), modules="math")
            _log.info("gmpo_core: compiled %s for %s, guards %s", self.fn.__name__, sizes, guards)
            return (lambda b, t: bool(holds(b, t, 4))), compiled
        except Exception as e:  # any failure: the same kernel through torch.compile
            _log.info("gmpo_core: direct Inductor compile failed (%r); using torch.compile", e)
            return None


def compile_kernels(backend: Any = "inductor") -> Kernels:
    """The two kernels compiled: by Inductor without Dynamo (:class:`_Direct`) for the default
    backend, with the hand-written one-pass CPU forward where it applies; else under
    ``torch.compile(dynamic=True, fullgraph=True, backend=backend)``."""
    if backend == "inductor":
        return Kernels(_Direct(_forward_kernel), _Direct(_backward_kernel), True, OnePass())
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
        dual: bool,
        speculate: bool,
        kernels: Kernels,
        strict: bool,
        extra: list[Tensor | None],
    ) -> tuple[Tensor, Tensor, Tensor]:
        args = (logp, old_logp, adv, mask, ref_logp, w_tok, w_row, params, dual, speculate)
        onepass = kernels.onepass
        out: tuple[Any, ...] | None = None
        if onepass is not None and onepass.applies(args):
            out = onepass(*args)
        if out is None:
            out = _run(kernels, strict, "forward", *args)
        loss, per_seq, log_coef, policy, n, *rest = out
        # d loss / d logp, written by the forward (``speculate``). An attribute, not a saved
        # tensor: the backward scales it in place and hands it on, once.
        ctx.loss_grad = rest.pop() if speculate else None
        # The statistics leave through ``extra``, not as outputs: autograd tracks three tensors.
        extra.extend(rest)
        ctx.save_for_backward(logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params)
        ctx.dual, ctx.kernels, ctx.strict = dual, kernels, strict
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        return loss, per_seq, log_coef

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_loss: Tensor | None, grad_ps: Tensor | None, grad_lc: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        loss_grad, ctx.loss_grad = ctx.loss_grad, None  # usable once (retain_graph: recompute)
        if not ctx.needs_input_grad[0]:
            return (None,) * 13
        if loss_grad is not None and grad_lc is None and not torch.compiler.is_compiling():
            return (_scale_loss_grad(loss_grad, grad_loss, grad_ps),) + (None,) * 12
        logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params = ctx.saved_tensors
        zero = policy.new_zeros(())
        grad = _run(
            ctx.kernels, ctx.strict, "backward",
            zero if grad_loss is None else grad_loss,
            zero.expand_as(policy) if grad_ps is None else grad_ps,
            zero.expand_as(policy) if grad_lc is None else grad_lc,
            logp, old_logp, adv, mask, ref_logp, w_tok, policy, n, params, ctx.dual,
        )  # fmt: skip
        return (grad,) + (None,) * 12


def _scale_loss_grad(loss_grad: Tensor, grad_loss: Tensor | None, grad_ps: Tensor | None) -> Tensor:
    """The gradient from that of ``loss`` (``loss_grad``, overwritten), when ``log_coef`` got no
    upstream gradient. Row i's gradient is proportional to the upstream gradient of its
    ``per_sequence_loss`` (policy and KL term alike), and ``loss`` is their mean, so a row scale
    ``B * grad_ps_i + grad_loss`` turns one into the other. On CPU an upstream gradient of
    exactly 1 (``loss.backward()``) skips the pass; on an accelerator reading it would sync.
    A missing upstream gradient (None) is zero, as in the backward kernel."""
    if grad_ps is not None:
        scale = grad_ps * grad_ps.shape[0]
        scale = scale if grad_loss is None else scale + grad_loss
        return loss_grad.mul_(scale.to(loss_grad.dtype).unsqueeze(-1))
    if grad_loss is None:
        return loss_grad.zero_()
    if grad_loss.device.type == "cpu" and grad_loss.item() == 1.0:
        return loss_grad
    return loss_grad.mul_(grad_loss.to(loss_grad.dtype))


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
    # Write the gradient of ``loss`` in the forward where a backward is coming, in full
    # precision only (a low-precision gradient scaled in the backward would be rounded twice).
    speculate = torch.is_grad_enabled() and logp.requires_grad and logp.dtype == params.dtype
    extra: list[Tensor | None] = []
    loss, per_seq, log_coef = _FusedGMPO.apply(  # type: ignore[no-untyped-call]
        logp, old_logp, advantages.detach(), mask, ref_logp, w_tok, w_row, params,
        log_dual is not None, speculate, kernels, strict, extra,
    )  # fmt: skip
    *stats, kl_sum, metrics = extra
    kl = None if ref_logp is None else kl_sum
    clip_stats = ClipStats(*stats)  # type: ignore[arg-type]
    return GMPOOutput(loss, per_seq, log_coef, clip_stats, kl, metrics)
