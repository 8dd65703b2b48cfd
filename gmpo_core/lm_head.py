"""Log-probabilities and entropies of sampled tokens from the LM head, without the (N, V) logits.

An RL step needs, for every generated token, the log-probability of the sampled token under the
policy and (for the entropy bonus and the logs) the entropy of the next-token distribution:

    z = s·(h Wᵀ + b) / τ                            logits of one token, (V,); s: logit scale
    log p_v = z_v − lse(z),   lse(z) = log Σ_v exp(z_v)
    logp = log p_y                                  y: the sampled token
    H = −Σ_v p_v log p_v = lse(z) − Σ_v p_v z_v

Materializing z for N tokens costs N·V floats (2.5 GB at N = 4096, V = 151,936 in float32), and
autograd keeps several such tensors alive. :func:`token_logprobs` instead walks the tokens in
chunks of ``chunk_size`` rows: the forward keeps only ``lse`` and ``H`` (two (N,) vectors), and the
backward recomputes each chunk's logits and turns them, in place, into the gradient

    ∂L/∂z_v = g_logp · (1[v = y] − p_v) − g_H · p_v · (log p_v + H)

(with g_logp, g_H the upstream gradients of ``logp`` and ``H``; the entropy term is
dH/dz_v = −p_v (log p_v + H)), then accumulates ∂L/∂h = (∂L/∂z) W·s/τ and
∂L/∂W += (∂L/∂z)ᵀ h·s/τ chunk by chunk. So the forward does one GEMM of N·V·H and the backward
three (one of them the recomputation): 4/3 of the materialized path's GEMM work, for a working
set of one (chunk, V) tile instead of several (N, V) tensors.

Within a tile the element-wise passes run on cache-sized blocks of rows on the CPU. Precision:
tiles, sums and gradient accumulators are float32 (float64 for float64 inputs), and logits are
never rounded to bf16/fp16. On the CPU, and for float32 inputs outside autocast, every GEMM runs
in float32 (a bf16/fp16 weight upcast in blocks of rows); on CUDA in half precision the GEMMs take
half operands into float32 results, and ``backward_precision`` says whether ∂L/∂z is rounded to
half for the backward's two (``gmpo_core._gemms`` has the rules). Outputs are float32 (float64
for float64 inputs); gradients reach ``hidden``, ``weight`` and ``bias`` in their own dtypes.

``backend="triton"`` runs the same computation as fused Triton kernels whose logits never leave
the chip (``gmpo_core._triton_head``, imported only then). The interface mirrors TRL 1.16's
``trl.kernels.ChunkedLogProbFunction``, so a trainer can swap one for the other.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from gmpo_core._gemms import (
    BACKWARD_PRECISIONS,
    GemmPlan,
    autocast_dtype,
    backward_gemms,
    gemm_plan,
    operand,
    project,
)

__all__ = [
    "BACKENDS",
    "BACKWARD_PRECISIONS",
    "DEFAULT_CHUNK_SIZE",
    "GemmPlan",
    "TokenLogProbs",
    "gemm_plan",
    "token_logprobs",
]

#: Tokens per chunk. At V = 151,936 a float32 tile of 256 tokens is 156 MB; with the float32
#: weight gradient (V·H·4 = 545 MB at H = 896) the forward+backward stays under 0.8 GB of extra
#: memory. Smaller chunks make the GEMMs narrower (slower) and re-read W more often; see
#: docs/lm_head.md for the measurements behind this value.
DEFAULT_CHUNK_SIZE = 256
#: ``backend``: torch ops on float32 tiles (default), or fused Triton kernels
BACKENDS = ("torch", "triton")

# Scratch bytes for the CPU's row blocks: a block and its scratch stay in the last-level cache,
# and each pass is one cheap parallel region (2 threads, V = 151,936: blocks of 6 rows made
# `amax` and `sub_` 40x slower per element than blocks of 32; torch 2.13).
_SCRATCH_BYTES = 20 << 20


class TokenLogProbs(NamedTuple):
    """Per-token outputs of :func:`token_logprobs` (unpacks as ``logps, entropies``)."""

    logps: Tensor
    """log p(y_t | context), the sampled tokens' log-probabilities. Shape: ``targets.shape``."""
    entropies: Tensor | None
    """Entropy of each next-token distribution, or None when not requested. Shape: ``targets.shape``."""


def _autocast_off(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast off for ``device``'s type where it has one (``meta`` refuses it)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _row_block(n_rows: int, vocab: int, elem_size: int, device: torch.device) -> int:
    """Rows per block of the element-wise passes: cache-sized on CPU, the whole tile elsewhere."""
    if device.type != "cpu":
        return max(n_rows, 1)
    return max(1, min(n_rows, _SCRATCH_BYTES // (vocab * elem_size)))


def _logit_tiles(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, scale: float, chunk: int,
    plan: GemmPlan,
) -> Iterator[tuple[int, int, Tensor, Tensor]]:  # fmt: skip
    """``(s, e, h, tile)`` for each chunk of tokens: its hidden states in the forward GEMM's
    dtype ``(e - s, H)`` and its logits ``(e - s, V)`` in the compute dtype, projected into one
    buffer that every chunk reuses (forward and recomputing backward). ``weight``: already
    :func:`operand`'s. With float32 GEMMs the scale is folded into ``h`` and the bias and the
    tile holds the logits z; with half operands (``h·s`` would be rounded) it holds z / scale,
    and the passes apply the scale (:func:`_sub_scaled`)."""
    n_tok, vocab = hidden.shape[0], weight.shape[0]
    cdt = plan.compute
    folded = plan.forward == cdt
    bias_s = None if bias is None else bias.to(cdt) * scale if folded else bias.to(cdt)  # (V,)
    tile_buf = torch.empty(chunk, vocab, device=hidden.device, dtype=cdt)
    for s in range(0, n_tok, chunk):
        e = min(s + chunk, n_tok)
        tile = tile_buf[: e - s]  # (n, V)
        h = hidden[s:e].to(plan.forward)  # (n, H)
        project(tile, h * scale if folded and scale != 1.0 else h, weight, bias_s)
        yield s, e, h, tile


def _sub_scaled(blk: Tensor, shift: Tensor, tile_scale: float) -> None:
    """``blk ← tile_scale·blk − shift`` row by row, in one pass. Shape: blk (rows, V), shift (rows,)."""
    if tile_scale == 1.0:
        blk.sub_(shift.unsqueeze(1))
    else:
        torch.add(shift.unsqueeze(1).neg(), blk, alpha=tile_scale, out=blk)


# Below this log-probability exp() is exactly 0 in float32 and float64: clamping to it changes no
# probability, and keeps p·log p (and its gradient) at 0 where a logit is −inf.
_LOG_ZERO = -1e4
# fallback reasons (GemmPlan.fallback) already warned about in this process
_WARNED: set[str] = set()


class _ChunkedTokenLogProbs(torch.autograd.Function):
    """The autograd node of :func:`token_logprobs` (inputs already flattened and validated)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,  # (N, H)
        weight: Tensor,  # (V, H)
        bias: Tensor | None,  # (V,)
        targets: Tensor,  # (N,) int64
        scale: float,  # logit_scale / temperature
        chunk_size: int,
        compute_entropy: bool,
        plan: GemmPlan,
    ) -> tuple[Tensor, Tensor | None]:
        ctx.set_materialize_grads(False)
        n_tok, vocab = hidden.shape[0], weight.shape[0]
        device = hidden.device
        cdt = plan.compute
        ts = 1.0 if plan.forward == cdt else scale  # z = ts·tile (_logit_tiles)

        row_max = torch.empty(n_tok, device=device, dtype=cdt)  # max_v z_v
        sum_exp = torch.empty(n_tok, device=device, dtype=cdt)  # Σ exp(z − max)
        target_z = torch.empty(n_tok, device=device, dtype=cdt)  # z_y − max
        dot = torch.empty(n_tok, device=device, dtype=cdt) if compute_entropy else None
        tgt = targets.unsqueeze(1)  # (N, 1)

        chunk = min(chunk_size, n_tok)
        rb = _row_block(chunk, vocab, torch.finfo(cdt).bits // 8, device)
        scratch = torch.empty(rb, vocab, device=device, dtype=cdt)
        with _autocast_off(device):
            w = operand(weight, plan.forward, cdt)
            for s, e, _h, tile in _logit_tiles(hidden, w, bias, scale, chunk, plan):
                for r0 in range(s, e, rb):
                    r1 = min(r0 + rb, e)
                    blk = tile[r0 - s : r1 - s]  # (rows, V), stays in cache for the passes below
                    sc = scratch[: r1 - r0]
                    m = row_max[r0:r1]
                    torch.amax(blk, dim=1, out=m)
                    if ts != 1.0:
                        m.mul_(ts)  # max z (ts > 0)
                    _sub_scaled(blk, m, ts)  # z − max
                    torch.gather(blk, 1, tgt[r0:r1], out=target_z[r0:r1].unsqueeze(1))
                    torch.exp(blk, out=sc)
                    torch.sum(sc, dim=1, out=sum_exp[r0:r1])
                    if dot is not None:  # Σ exp(z − max)·(z − max): multiply in place, then sum
                        # (a -inf logit, say a masked vocabulary entry, adds 0, not 0·(−inf))
                        torch.sum(sc.mul_(blk.clamp_(min=_LOG_ZERO)), dim=1, out=dot[r0:r1])
        log_sum = torch.log(sum_exp)
        logps = target_z - log_sum  # (N,)
        lse = row_max + log_sum  # (N,)
        entropies = None if dot is None else log_sum - dot / sum_exp  # (N,)

        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropies)
        ctx.scale, ctx.chunk_size, ctx.plan = scale, chunk_size, plan
        return logps, entropies

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_logps: Tensor | None, grad_entropies: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropies = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_logps is None and grad_entropies is None:
            return None, None, None, None, None, None, None, None
        n_tok, vocab = hidden.shape[0], weight.shape[0]
        device = hidden.device
        plan: GemmPlan = ctx.plan
        cdt = plan.compute
        scale: float = ctx.scale
        ts = 1.0 if plan.forward == cdt else scale  # z = ts·tile (_logit_tiles)

        # ∂L/∂(h Wᵀ + b) = ∂L/∂z · s / τ: fold s / τ into the per-token upstream gradients.
        g_l = None if grad_logps is None else grad_logps.to(cdt) * scale  # (N,)
        if grad_entropies is not None:
            g_e = grad_entropies.to(cdt) * scale  # (N,)
            # ∂L/∂z_v = g_l·1[v = y] − p_v·(g_l + g_e·H + g_e·log p_v)
            neg_ge = -g_e
            neg_c = -(g_e * entropies) if g_l is None else -(g_l + g_e * entropies)
        else:
            neg_ge = None
            neg_c = None if g_l is None else -g_l
        tgt = targets.unsqueeze(1)  # (N, 1)

        grad_h = torch.empty(n_tok, hidden.shape[1], device=device, dtype=cdt) if need_h else None
        grad_w = torch.zeros(weight.shape, device=device, dtype=cdt) if need_w else None
        grad_b = torch.zeros(vocab, device=device, dtype=cdt) if need_b else None

        chunk = min(ctx.chunk_size, n_tok)
        rb = _row_block(chunk, vocab, torch.finfo(cdt).bits // 8, device)
        scratch = torch.empty(rb, vocab, device=device, dtype=cdt) if neg_ge is not None else None
        half = plan.backward != cdt  # ∂L/∂z rounded into a half buffer for its GEMMs
        half_buf = torch.empty(chunk, vocab, device=device, dtype=plan.backward) if half else None
        with _autocast_off(device):
            w = operand(weight, plan.forward, cdt)
            w_b = w if plan.backward == plan.forward else operand(weight, plan.backward, cdt)
            for s, e, h, tile in _logit_tiles(hidden, w, bias, scale, chunk, plan):
                for r0 in range(s, e, rb):
                    r1 = min(r0 + rb, e)
                    blk = tile[r0 - s : r1 - s]  # (rows, V)
                    _sub_scaled(blk, lse[r0:r1], ts)  # log p
                    if neg_ge is not None and scratch is not None and neg_c is not None:
                        sc = scratch[: r1 - r0]
                        blk.clamp_(min=_LOG_ZERO)  # p = 0 stays 0 below, and no 0·inf
                        torch.exp(blk, out=sc)  # p
                        blk.mul_(neg_ge[r0:r1].unsqueeze(1)).add_(neg_c[r0:r1].unsqueeze(1))
                        blk.mul_(sc)
                    elif neg_c is not None:
                        blk.exp_().mul_(neg_c[r0:r1].unsqueeze(1))
                    if g_l is not None:
                        blk.scatter_add_(1, tgt[r0:r1], g_l[r0:r1].unsqueeze(1))
                if plan.backward != plan.forward:
                    h = hidden[s:e].to(plan.backward)
                gh = None if grad_h is None else grad_h[s:e]
                backward_gemms(tile, h, w_b, gh, grad_w, half_buf)
                if grad_b is not None:
                    grad_b.add_(tile.sum(0))

        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None or bias is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def _triton_backend() -> Any:
    """The fused head (``gmpo_core._triton_head``), imported on first use: Triton is optional."""
    try:
        from gmpo_core._triton_head import fused_token_logprobs
    except ImportError as exc:
        msg = f"token_logprobs(backend='triton') needs Triton (pip install triton): {exc}"
        raise ImportError(msg) from exc
    return fused_token_logprobs


def token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    logit_scale: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    compute_entropy: bool = True,
    backward_precision: str = "half",
    backend: str = "torch",
) -> TokenLogProbs:
    """Sampled tokens' log-probabilities and entropies from hidden states and the LM-head weight.

    With logits z = s·(h Wᵀ + b) / τ of each token (τ = ``temperature``, s = ``logit_scale``):

        logps = z_y − log Σ_v exp(z_v)
        entropies = −Σ_v p_v log p_v,   p = softmax(z)

    computed ``chunk_size`` tokens at a time, never the (N, V) logits (the backward recomputes
    each chunk's); gradients flow to ``hidden``, ``weight`` and ``bias`` from both outputs. Equal,
    within float32 rounding, to ``log_softmax(z).gather(-1, targets)`` and its entropy.

    Shape:
        hidden: (..., H), e.g. (N, H) or (B, T, H); any floating dtype.
        weight: (V, H), the LM head's weight (``lm_head.weight``).
        targets: (...), token ids in [0, V), the leading shape of ``hidden``; a negative id
            (-100) is ignored: log-prob 0, no gradient (its entropy is computed).
        bias: (V,) or None.
        logps, entropies: ``targets.shape``, float32 (float64 for float64 inputs).

    Args:
        temperature: the logits are divided by it (the sampling temperature), > 0.
        logit_scale: the logits are multiplied by it (> 0): the ``logit_scale`` some models'
            configs carry (TRL's ``ChunkedLogProbFunction`` argument of the same name).
            Final-logit soft-capping (Gemma 2) is not supported.
        chunk_size: tokens per chunk (>= 1). Peak extra memory is about one float32 (chunk, V)
            tile plus the float32 (V, H) weight gradient; see ``DEFAULT_CHUNK_SIZE``.
        compute_entropy: when False, ``entropies`` is None and the forward skips its reduction.
        backward_precision: on CUDA in half precision, ``"half"`` (∂L/∂z rounded to the half
            dtype for the backward's GEMMs, float32 accumulation: TRL's precision) or
            ``"float32"``; the logits are float32 either way (docs/lm_head.md, "Precision").
        backend: ``"torch"`` or ``"triton"`` (fused kernels, logits kept on chip: float32, bf16
            or fp16 CUDA tensors, or CPU tensors in Triton's interpreter, for tests).

    Returns:
        :class:`TokenLogProbs` ``(logps, entropies)``.

    Raises:
        ValueError: on mismatched shapes, non-integer targets, a non-floating hidden or weight,
            ``temperature`` or ``logit_scale`` not finite and > 0, ``chunk_size`` < 1, or
            ``backward_precision`` or ``backend`` unknown; float64 inputs for ``"triton"``.
        ImportError: ``backend="triton"`` without Triton installed.
    """
    if not hidden.is_floating_point() or not weight.is_floating_point():
        raise ValueError(
            f"hidden and weight must be floating point, got {hidden.dtype} and {weight.dtype}"
        )
    if weight.dim() != 2:
        raise ValueError(f"weight must be (V, H), got shape {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be (..., H) with H = weight.shape[1] = {weight.shape[1]}, "
            f"got hidden {tuple(hidden.shape)}"
        )
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"targets must have hidden's leading shape {tuple(hidden.shape[:-1])}, "
            f"got {tuple(targets.shape)}"
        )
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer token ids, got {targets.dtype}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    if not (math.isfinite(logit_scale) and logit_scale > 0):
        raise ValueError(f"logit_scale must be finite and > 0, got {logit_scale}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    if backward_precision not in BACKWARD_PRECISIONS:
        raise ValueError(
            f"backward_precision must be one of {BACKWARD_PRECISIONS}, got {backward_precision!r}"
        )
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    lead = targets.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])  # (N, H)
    t1 = targets.reshape(-1).long()  # (N,)
    device_type = h2.device.type
    plan = gemm_plan(
        device_type, h2.dtype, weight.dtype, None if bias is None else bias.dtype,
        autocast_dtype(device_type), backward_precision,
    )  # fmt: skip
    if h2.shape[0] == 0:
        zero = (h2.sum(-1) + weight.sum() * 0).to(plan.compute).reshape(lead)  # keeps the graph
        return TokenLogProbs(zero, zero.clone() if compute_entropy else None)
    if plan.fallback is not None and plan.fallback not in _WARNED:
        _WARNED.add(plan.fallback)
        warnings.warn(plan.fallback, stacklevel=2)
    scale = float(logit_scale) / float(temperature)
    if backend == "triton":
        if plan.compute != torch.float32:
            msg = f"backend='triton' takes float32, bf16 or fp16 inputs, got {h2.dtype}"
            raise ValueError(f"{msg} hidden states and a {weight.dtype} weight")
        fused = _triton_backend()
        logps, entropies = fused(h2, weight, bias, t1, scale, chunk_size, compute_entropy, plan)
    else:  # a negative (ignored) target: log-prob 0, as the kernels do
        logps, entropies = _ChunkedTokenLogProbs.apply(  # type: ignore[no-untyped-call]
            h2, weight, bias, t1.clamp(min=0), scale, chunk_size, compute_entropy, plan,
        )  # fmt: skip
        logps = logps.masked_fill(t1 < 0, 0.0)
    ent = None if entropies is None else entropies.reshape(lead)
    return TokenLogProbs(logps.reshape(lead), ent)
