"""The fused LM head: :func:`gmpo_core.token_logprobs` with ``backend="triton"``.

Imported only by that backend (``gmpo_core`` itself needs torch and numpy alone). Two Triton
kernels, each of which computes logits tiles ``z = s·(h Wᵀ + b)/τ`` in float32 accumulators
from the inputs' own bf16/fp16/float32 operands and never writes them to device memory:

- **forward** (one program per block of ``BLOCK_N`` tokens and split of the vocabulary: as
  many splits as fill the GPU, merged by :func:`_merge`): walks its split in tiles of
  ``BLOCK_V`` entries, each tile the sum over ``BLOCK_H`` slices of the hidden size of
  ``tl.dot`` products, and folds it into an online log-sum-exp (running max m, Σ exp(z − m), and
  Σ exp(z − m)·(z − m) for the entropy) and the target's logit. It writes four floats per token
  and split (max, Σexp, Σexp·(z − max), z_y): 0 bytes per (token, vocabulary entry).
- **backward** (one program per (token block, vocabulary tile), over one vocabulary slice of
  all N tokens at a time, the slice's ∂L/∂z at most ``_DZ_BYTES``): recomputes the tile the same
  way, turns it into ∂L/∂(h Wᵀ + b) = s/τ·(g_logp·(1[v = y] − p_v) − g_H·p_v·(log p_v + H)), and
  stores that in the dtype of the backward's GEMMs (the half dtype for
  ``backward_precision="half"`` on CUDA, else float32), with each block's column sums for the
  bias gradient. The two gradient GEMMs are cuBLAS's: ∂L/∂h += ∂L/∂z·W[slice] (float32
  accumulation) and ∂L/∂W[slice] = (∂L/∂z)ᵀh, each row of it written once. Per (token,
  vocabulary entry) that is ∂L/∂z written once and read twice: 2 + 2·2 = 6 bytes in bf16 (12 in
  float32), the only per-entry traffic of the whole head (``benchmarks/head_model.py``).
  ``chunk_size`` (tokens per chunk) is the torch backend's; this one slices the vocabulary.

Operands: on a GPU, bf16 (fp16) hidden states and weight are multiplied by ``tl.dot`` directly
(products exact in float32, float32 accumulation: tensor cores); float32 operands use
``input_precision="ieee"`` (TF32 would round the operands to 10-bit mantissas and lose the
1e-5 accuracy). In Triton's interpreter (CPU tensors, or ``TRITON_INTERPRET=1``) the tiles are
converted to float32 before ``tl.dot``: the interpreter's bf16 ``tl.dot`` is wrong (Triton issue
11584), and float32 products of bf16 numbers are exact, so the result is the same.

CPU tensors run only in the interpreter, which Triton chooses once, when it is first imported
(its own library's functions are decorated then): with ``TRITON_INTERPRET=1`` set at that time,
every kernel (CUDA tensors' too) is interpreted; without it, CUDA tensors run compiled kernels
and CPU tensors are refused with a message saying so.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton  # the caller turns an ImportError into one clear message
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable
from triton.runtime.jit import JITFunction

from gmpo_core._gemms import GemmPlan, operand

__all__ = ["fused_token_logprobs"]

# Below this log-probability exp() is 0 in float32: the clamp keeps p·log p at 0 where z = −inf.
_LOG_ZERO = tl.constexpr(-1e4)  # a global a kernel reads must be a constexpr
#: (BLOCK_N, BLOCK_V, BLOCK_H) of the kernels, natively on a GPU and in the interpreter (where
#: each program is numpy work: fewer, larger tiles are faster)
_BLOCKS_GPU = (64, 128, 64)
_BLOCKS_INTERPRETED = (32, 128, 64)
#: programs the forward aims at: 4 per SM of an H100 (132 SMs); fewer token blocks than that
#: split the vocabulary among programs, merged in torch (:func:`_merge`)
_PROGRAMS = 528
#: bytes of the backward's ∂L/∂z buffer (all tokens × one vocabulary slice): 256 MB, e.g. 4096
#: tokens × 32,768 entries in bf16
_DZ_BYTES = 256 << 20


def _forward_kernel(  # type: ignore[no-untyped-def]
    h_ptr, w_ptr, b_ptr, y_ptr, stats_ptr,
    n_rows, vocab, hid, stride_h, stride_w, scale, split_len,
    HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, F32_DOT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)  # this program's slice of the vocabulary: split_len entries
    rmask = rows < n_rows
    y = tl.load(y_ptr + rows, mask=rmask, other=-1)
    v_end = tl.minimum(vocab, (split + 1) * split_len)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)  # running max of z
    s = tl.zeros([BLOCK_N], dtype=tl.float32)  # Σ exp(z − m)
    a = tl.zeros([BLOCK_N], dtype=tl.float32)  # Σ exp(z − m)·(z − m)
    zy = tl.zeros([BLOCK_N], dtype=tl.float32)  # z of the target
    for v0 in range(split * split_len, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        cmask = cols < v_end
        acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
        for k0 in range(0, hid, BLOCK_H):
            ks = k0 + tl.arange(0, BLOCK_H)
            kmask = ks < hid
            ht = tl.load(
                h_ptr + rows[:, None] * stride_h + ks[None, :],
                mask=rmask[:, None] & kmask[None, :], other=0.0,
            )  # fmt: skip
            wt = tl.load(  # (BLOCK_H, BLOCK_V): Wᵀ's tile
                w_ptr + cols[None, :] * stride_w + ks[:, None],
                mask=cmask[None, :] & kmask[:, None], other=0.0,
            )  # fmt: skip
            if F32_DOT:
                acc = tl.dot(ht.to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(ht, wt, acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        z = tl.where(cmask[None, :], acc * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row of −inf so far
        alpha = tl.exp(m - m_safe)
        zc = tl.maximum(z - m_safe[:, None], _LOG_ZERO)
        p = tl.exp(zc)
        if ENTROPY:
            shift = s * tl.where(s > 0, m - m_safe, 0.0)  # 0 while the row is all −inf
            a = alpha * (a + shift) + tl.sum(p * zc, 1)
        s = alpha * s + tl.sum(p, 1)
        zy += tl.sum(tl.where(cols[None, :] == y[:, None], z, 0.0), 1)
        m = m_new
    # this split's statistics, (4, splits, N): merged across splits by _merge
    base = stats_ptr + split * n_rows + rows
    plane = tl.num_programs(1) * n_rows
    tl.store(base, m, mask=rmask)
    tl.store(base + plane, s, mask=rmask)
    tl.store(base + 2 * plane, a, mask=rmask)
    tl.store(base + 3 * plane, zy, mask=rmask)


def _backward_kernel(  # type: ignore[no-untyped-def]
    h_ptr, w_ptr, b_ptr, y_ptr, lse_ptr, ent_ptr, gl_ptr, ge_ptr, dz_ptr, db_ptr,
    n_rows, vocab, v_start, v_end, hid, stride_h, stride_w, stride_dz, scale,
    HAS_BIAS: tl.constexpr, HAS_GL: tl.constexpr, HAS_GE: tl.constexpr,
    F32_DOT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = v_start + tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)  # of the vocabulary
    rmask = rows < n_rows
    cmask = cols < v_end
    acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for k0 in range(0, hid, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        kmask = ks < hid
        ht = tl.load(
            h_ptr + rows[:, None] * stride_h + ks[None, :],
            mask=rmask[:, None] & kmask[None, :], other=0.0,
        )  # fmt: skip
        wt = tl.load(
            w_ptr + cols[None, :] * stride_w + ks[:, None],
            mask=cmask[None, :] & kmask[:, None], other=0.0,
        )  # fmt: skip
        if F32_DOT:
            acc = tl.dot(ht.to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(ht, wt, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
    logp = tl.maximum(acc * scale - lse[:, None], _LOG_ZERO)  # log p_v (p = 0 stays 0)
    p = tl.exp(logp)
    coef = tl.zeros([BLOCK_N], dtype=tl.float32)  # g_logp + g_H·H, the p_v term's factor
    if HAS_GL:
        y = tl.load(y_ptr + rows, mask=rmask, other=-1)
        gl = tl.load(gl_ptr + rows, mask=rmask, other=0.0)
        gl = tl.where((y >= 0) & (y < vocab), gl, 0.0)
        coef += gl
    if HAS_GE:
        ge = tl.load(ge_ptr + rows, mask=rmask, other=0.0)
        ent = tl.load(ent_ptr + rows, mask=rmask, other=0.0)
        coef += ge * ent
        dz = -p * (coef[:, None] + ge[:, None] * logp)
    else:
        dz = -p * coef[:, None]
    if HAS_GL:
        dz += tl.where(cols[None, :] == y[:, None], gl[:, None], 0.0)
    dz = tl.where(rmask[:, None] & cmask[None, :], dz * scale, 0.0)  # ∂L/∂(h Wᵀ + b)
    tl.store(
        dz_ptr + rows[:, None] * stride_dz + (cols - v_start)[None, :],
        dz.to(dz_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=rmask[:, None] & cmask[None, :],
    )  # fmt: skip
    if HAS_BIAS:
        tl.store(db_ptr + pid_n * stride_dz + (cols - v_start), tl.sum(dz, 0), mask=cmask)


# Triton decides once, when it is imported, whether its kernels (its own library's @jit
# functions among them) are interpreted; this module's kernels follow that decision, whatever
# TRITON_INTERPRET says by the time it is imported.
_INTERPRETED = not isinstance(tl.zeros, JITFunction)


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` was set when
    Triton was first imported (torch.compile and TRL import it when it is installed)."""
    return _INTERPRETED


def _jit(fn: Any) -> Any:
    """``triton.jit`` in the mode Triton was imported in (:data:`_INTERPRETED`)."""
    if _INTERPRETED:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    return JITFunction(fn)


_forward = _jit(_forward_kernel)
_backward = _jit(_backward_kernel)


def _check_device(device: torch.device) -> None:
    if device.type == "cuda" or (device.type == "cpu" and interpreted()):
        return
    if device.type == "cpu":
        raise ValueError(
            "token_logprobs(backend='triton') runs CPU tensors only in Triton's interpreter: set "
            "TRITON_INTERPRET=1 before Triton is first imported (torch.compile and TRL import "
            "it), e.g. in the environment; it is about 100x slower than backend='torch': for "
            "tests"
        )
    raise ValueError(f"token_logprobs(backend='triton') needs CUDA tensors, got {device.type}")


def _splits(n_tok: int, vocab: int, bn: int, bv: int) -> int:
    """Vocabulary splits of the forward: enough programs to fill the GPU (``_PROGRAMS``) where
    the token blocks alone are too few, each split at least one vocabulary tile."""
    blocks = triton.cdiv(n_tok, bn)
    return max(1, min(int(triton.cdiv(vocab, bv)), int(triton.cdiv(_PROGRAMS, blocks))))


def _merge(stats: Tensor, targets: Tensor, vocab: int) -> tuple[Tensor, Tensor, Tensor]:
    """lse, log-probs and entropies (N,) from the splits' (max, Σexp, Σexp·(z − max), z_y)."""
    m, s, a, zy = stats.unbind(0)  # (splits, N) each
    top = m.amax(0)  # (N,)
    top = torch.where(top == -math.inf, 0.0, top)
    alpha = torch.exp(m - top)  # 0 for a split of −inf only
    shift = torch.where(s > 0, m - top, 0.0)
    s_all = (alpha * s).sum(0)
    a_all = (alpha * (a + s * shift)).sum(0)
    log_s = torch.log(s_all)
    lse = top + log_s
    valid = (targets >= 0) & (targets < vocab)  # an ignored target: log-prob 0, no gradient
    logps = torch.where(valid, zy.sum(0) - lse, 0.0)
    return lse, logps, log_s - a_all / s_all


def _f32_dot(a: Tensor, b: Tensor, interpreted: bool) -> bool:
    """Whether the kernels convert tiles to float32 (``input_precision="ieee"``) before
    ``tl.dot``: in the interpreter, for float32 operands, or for operands of two dtypes."""
    return interpreted or a.dtype == torch.float32 or a.dtype != b.dtype


class _FusedTokenLogProbs(torch.autograd.Function):
    """The autograd node of ``token_logprobs(..., backend="triton")`` (inputs validated)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,  # (N, H)
        weight: Tensor,  # (V, H)
        bias: Tensor | None,  # (V,)
        targets: Tensor,  # (N,) int64
        scale: float,
        chunk_size: int,
        compute_entropy: bool,
        plan: GemmPlan,
    ) -> tuple[Tensor, Tensor | None]:
        ctx.set_materialize_grads(False)
        n_tok, vocab = hidden.shape[0], weight.shape[0]
        device = hidden.device
        interp = interpreted()
        bn, bv, bh = _BLOCKS_INTERPRETED if interp else _BLOCKS_GPU
        # the forward's operands: the plan's (a half copy only under autocast), contiguous rows
        h = hidden.to(plan.forward) if plan.forward != plan.compute else hidden
        w = operand(weight, plan.forward, plan.compute)
        h, w = h.contiguous(), w.contiguous()
        splits = _splits(n_tok, vocab, bn, bv)
        split_len = triton.cdiv(triton.cdiv(vocab, splits), bv) * bv
        splits = triton.cdiv(vocab, split_len)
        stats = torch.empty(4, splits, n_tok, device=device, dtype=torch.float32)
        b = bias.contiguous() if bias is not None else stats  # a placeholder pointer
        _forward[(triton.cdiv(n_tok, bn), splits)](
            h, w, b, targets, stats,
            n_tok, vocab, h.shape[1], h.stride(0), w.stride(0), scale, split_len,
            HAS_BIAS=bias is not None, ENTROPY=compute_entropy,
            F32_DOT=_f32_dot(h, w, interp), BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh,
        )  # fmt: skip
        lse, logps, ent = _merge(stats, targets, vocab)
        entropies = ent if compute_entropy else None
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
        nones: tuple[None, ...] = (None,) * 5
        if grad_logps is None and grad_entropies is None:
            return (None, None, None, *nones)
        n_tok, vocab = hidden.shape[0], weight.shape[0]
        device = hidden.device
        plan: GemmPlan = ctx.plan
        cdt = plan.compute
        interp = interpreted()
        bn, bv, bh = _BLOCKS_INTERPRETED if interp else _BLOCKS_GPU
        h_f = hidden.to(plan.forward) if plan.forward != cdt else hidden
        w_f = operand(weight, plan.forward, cdt)
        h_f, w_f = h_f.contiguous(), w_f.contiguous()
        w_b = w_f if plan.backward == plan.forward else operand(weight, plan.backward, cdt)
        f32_dot = _f32_dot(h_f, w_f, interp)
        gl = None if grad_logps is None else grad_logps.to(torch.float32).contiguous()
        ge = None if grad_entropies is None else grad_entropies.to(torch.float32).contiguous()
        has_ge = ge is not None and entropies is not None

        grad_h = torch.zeros(n_tok, hidden.shape[1], device=device, dtype=cdt) if need_h else None
        grad_w = torch.empty(weight.shape, device=device, dtype=cdt) if need_w else None
        grad_b = (
            torch.empty(vocab, device=device, dtype=cdt) if need_b and bias is not None else None
        )
        # ∂L/∂z of all tokens for one vocabulary slice at a time (each ∂L/∂W row written once)
        elt = torch.finfo(plan.backward).bits // 8
        vc = min(vocab, max(bv, _DZ_BYTES // (n_tok * elt) // bv * bv))
        # Triton's interpreter truncates float32 to bf16 (a GPU rounds to nearest even, as torch
        # does): there the kernel writes float32 and torch rounds each slice
        store = torch.float32 if interp and plan.backward == torch.bfloat16 else plan.backward
        dz_buf = torch.empty(n_tok, vc, device=device, dtype=store)
        blocks = triton.cdiv(n_tok, bn)
        db_buf = torch.empty(blocks, vc, device=device, dtype=torch.float32)
        b = bias.contiguous() if bias is not None else lse  # a placeholder pointer
        h_b = hidden.to(plan.backward) if need_w else hidden  # (N, H), ∂L/∂W's operand
        half = plan.backward != cdt  # ∂L/∂z in the half dtype: float32 results
        with torch.autocast(device.type, enabled=False):  # cuda or cpu: both have one
            for v0 in range(0, vocab, vc):
                v1 = min(v0 + vc, vocab)
                _backward[(blocks, triton.cdiv(v1 - v0, bv))](
                    h_f, w_f, b, targets, lse, entropies if has_ge else lse,
                    lse if gl is None else gl, lse if ge is None else ge, dz_buf, db_buf,
                    n_tok, vocab, v0, v1, h_f.shape[1], h_f.stride(0), w_f.stride(0), vc,
                    ctx.scale, HAS_BIAS=grad_b is not None, HAS_GL=gl is not None,
                    HAS_GE=has_ge, F32_DOT=f32_dot, BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh,
                )  # fmt: skip
                dz = dz_buf[:, : v1 - v0].to(plan.backward)  # (N, v1 - v0)
                if grad_b is not None:
                    torch.sum(db_buf[:, : v1 - v0], 0, out=grad_b[v0:v1])
                w_s = w_b[v0:v1]
                if half:  # tensor cores, float32 accumulation
                    if grad_h is not None:
                        torch.addmm(grad_h, dz, w_s, out_dtype=cdt, out=grad_h)
                    if grad_w is not None:
                        torch.mm(dz.t(), h_b, out_dtype=cdt, out=grad_w[v0:v1])
                else:
                    if grad_h is not None:
                        grad_h.addmm_(dz, w_s.to(cdt))
                    if grad_w is not None:
                        torch.mm(dz.t(), h_b, out=grad_w[v0:v1])
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None or bias is None else grad_b.to(bias.dtype),
            *nones,
        )


def fused_token_logprobs(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, scale: float,
    chunk_size: int, compute_entropy: bool, plan: GemmPlan,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """Log-probs and entropies (float32, (N,)) of flattened inputs; ``scale`` = s/τ."""
    _check_device(hidden.device)
    out: tuple[Tensor, Tensor | None] = _FusedTokenLogProbs.apply(  # type: ignore[no-untyped-call]
        hidden, weight, bias, targets, scale, chunk_size, compute_entropy, plan
    )
    return out
