"""The LM head's GEMMs: which dtypes they run in, and running them.

:func:`token_logprobs` multiplies three times per chunk of tokens (the logits ``h Wᵀ``, and in
the backward ``∂L/∂z · W`` and ``(∂L/∂z)ᵀ h``, besides recomputing the logits). Which dtype their
operands take is one pure function, :func:`gemm_plan`, of the device type, the inputs' dtypes,
the autocast state and the ``backward_precision`` option, so that a test can drive it for any
device without having one; :func:`project` and :func:`backward_gemms` run what it chose.

- **Half precision on CUDA** (bf16/fp16 weights, or an enabled bf16/fp16 autocast): the logits'
  GEMM takes the half-precision operands and writes a float32 result
  (``torch.mm(a, b, out_dtype=torch.float32)``, aten's ``mm.dtype`` overloads, torch >= 2.8):
  tensor cores, float32 accumulation, and no rounding of the logits. A product of two bf16 (or
  fp16) numbers is exact in float32, so the logits equal those of float32 GEMMs on the upcast
  operands up to the order of summation. The backward's GEMMs take ``∂L/∂z`` rounded to the
  half dtype (TRL's and Liger's precision) with float32 accumulation
  (``backward_precision="half"``, the default), or run in float32 as the CPU does
  (``"float32"``: ``∂L/∂z`` not rounded, at the float32 rate).
- **Everywhere else** (the CPU, float32 or float64 inputs outside autocast): float32 (float64)
  GEMMs, a bf16/fp16 weight upcast ``VOCAB_BLOCK`` rows at a time. On a CUDA without the
  float32-output overload (torch < 2.8) or another accelerator, half precision asked for falls
  back to this path with a warning, once (:attr:`GemmPlan.fallback`): the logits stay exact,
  at the float32 rate. The CPU takes this path without a warning: torch has no float32-output
  bf16 GEMM on the CPU (``aten::mm.dtype`` has no CPU kernel), and a bf16 GEMM with a bf16
  result would round the logits (docs/lm_head.md, "Precision").
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "BACKWARD_PRECISIONS",
    "VOCAB_BLOCK",
    "GemmPlan",
    "autocast_dtype",
    "backward_gemms",
    "float32_output_gemm",
    "gemm_plan",
    "operand",
    "project",
]

#: ``backward_precision`` values: "half" (∂L/∂z rounded to the half dtype, float32 accumulation)
#: or "float32" (float32 GEMMs); the forward is the same for both
BACKWARD_PRECISIONS = ("half", "float32")
#: Rows of the weight upcast at a time when it is not in the GEMMs' dtype (bf16 on the CPU).
VOCAB_BLOCK = 8192
_HALF = (torch.bfloat16, torch.float16)
# device types that take the float32 path without a warning: the CPU (measured: no float32-output
# bf16 GEMM; docs/lm_head.md) and meta (shapes only)
_QUIET = ("cpu", "meta")
# torch >= 2.8 declares mm/addmm with an out_dtype (aten::mm.dtype_out, aten::addmm.dtype_out)
_HAS_DTYPE_OVERLOADS = all(
    "dtype_out" in getattr(torch.ops.aten, op).overloads() for op in ("mm", "addmm")
)


class GemmPlan(NamedTuple):
    """The dtypes of the head's GEMMs (:func:`gemm_plan`)."""

    compute: torch.dtype
    """Tiles, sums, results and gradient accumulators: float32 (float64 for float64 inputs)."""
    forward: torch.dtype
    """Operands of the logits' GEMM ``h Wᵀ`` (the recomputation's too): a half dtype, whose
    products torch writes in ``compute``, or ``compute`` itself."""
    backward: torch.dtype
    """Operands of ``∂L/∂z · W`` and ``(∂L/∂z)ᵀ h``: a half dtype or ``compute``."""
    fallback: str | None
    """Why half precision was asked for and float32 GEMMs run instead (warned once), or None."""


def float32_output_gemm(device_type: str) -> bool:
    """Whether torch multiplies bf16/fp16 matrices into a float32 result on ``device_type``:
    CUDA, torch >= 2.8 (``torch.mm``/``torch.addmm`` with ``out_dtype=torch.float32``)."""
    return device_type == "cuda" and _HAS_DTYPE_OVERLOADS


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype of an autocast enabled for ``device_type`` here, or None."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def gemm_plan(
    device_type: str,
    hidden: torch.dtype,
    weight: torch.dtype,
    bias: torch.dtype | None = None,
    autocast: torch.dtype | None = None,
    backward_precision: str = "half",
) -> GemmPlan:
    """The GEMMs' dtypes for inputs of these dtypes on ``device_type`` (``autocast``: the dtype of
    an enabled autocast, :func:`autocast_dtype`). Half precision is the autocast's bf16/fp16, else
    a bf16/fp16 weight's dtype; a float32 weight outside autocast keeps float32 GEMMs."""
    compute = torch.float32
    for dt in (hidden, weight, bias):
        if dt is not None:
            compute = torch.promote_types(compute, dt)
    half = autocast if autocast in _HALF else weight if weight in _HALF else None
    if compute != torch.float32 or half is None:
        return GemmPlan(compute, compute, compute, None)
    if not float32_output_gemm(device_type):
        fallback = None
        if device_type not in _QUIET:
            fallback = (
                f"torch {torch.__version__} has no {half}-to-float32 GEMM on {device_type} "
                "(torch.mm(..., out_dtype=torch.float32): CUDA, torch >= 2.8), so the LM head "
                "(gmpo_core.token_logprobs) runs its GEMMs in float32: exact logits, at the "
                "float32 rate"
            )
        return GemmPlan(compute, compute, compute, fallback)
    return GemmPlan(compute, half, half if backward_precision == "half" else compute, None)


def operand(weight: Tensor, dtype: torch.dtype, compute: torch.dtype) -> Tensor:
    """``weight`` for GEMMs whose operands are ``dtype``: itself, or one half-precision copy for
    the pass (a float32 weight under autocast); the float32 path upcasts blocks itself."""
    return weight if weight.dtype == dtype or dtype == compute else weight.to(dtype)


def project(out: Tensor, h: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """``out = h @ weight.T (+ bias)`` in ``out``'s dtype; half-precision ``h`` and ``weight``
    are multiplied into it directly (float32 result), others in ``out``'s dtype.

    Shape: h (n, H), weight (V, H), bias (V,), out (n, V).
    """
    cdt = out.dtype
    if h.dtype != cdt:  # half operands, float32 products and sums
        torch.mm(h, weight.t(), out_dtype=cdt, out=out)
        if bias is not None:
            out.add_(bias)
        return
    if weight.dtype == cdt:
        if bias is None:
            torch.mm(h, weight.t(), out=out)
        else:
            torch.addmm(bias, h, weight.t(), out=out)
        return
    vocab = weight.shape[0]
    for v0 in range(0, vocab, VOCAB_BLOCK):
        v1 = min(v0 + VOCAB_BLOCK, vocab)
        w = weight[v0:v1].to(cdt)  # (vb, H) upcast block
        if bias is None:
            torch.mm(h, w.t(), out=out[:, v0:v1])
        else:
            torch.addmm(bias[v0:v1], h, w.t(), out=out[:, v0:v1])


def backward_gemms(
    grad_z: Tensor,
    h: Tensor,
    weight: Tensor,
    grad_h: Tensor | None,
    grad_w: Tensor | None,
    half_buf: Tensor | None = None,
) -> None:
    """``grad_h = grad_z @ weight`` and ``grad_w += grad_z.T @ h``, in ``grad_z``'s dtype, or,
    with ``half_buf`` (a buffer in the half dtype of ``h`` and ``weight``), on ``grad_z``
    rounded into it with float32 results and accumulation.

    Shape: grad_z (n, V), h (n, H), weight (V, H), grad_h (n, H), grad_w (V, H),
    half_buf (>= n, V).
    """
    cdt = grad_z.dtype
    if half_buf is not None:
        gz = half_buf[: grad_z.shape[0]].copy_(grad_z)  # (n, V), rounded
        if grad_h is not None:
            torch.mm(gz, weight, out_dtype=cdt, out=grad_h)
        if grad_w is not None:
            torch.addmm(grad_w, gz.t(), h, out_dtype=cdt, out=grad_w)
        return
    if weight.dtype == cdt:
        if grad_h is not None:
            torch.mm(grad_z, weight, out=grad_h)
        if grad_w is not None:
            grad_w.addmm_(grad_z.t(), h)
        return
    if grad_h is not None:
        grad_h.zero_()
    vocab = weight.shape[0]
    for v0 in range(0, vocab, VOCAB_BLOCK):
        v1 = min(v0 + VOCAB_BLOCK, vocab)
        gz = grad_z[:, v0:v1]  # (n, vb)
        if grad_h is not None:
            grad_h.addmm_(gz, weight[v0:v1].to(cdt))
        if grad_w is not None:
            grad_w[v0:v1].addmm_(gz.t(), h)
