"""Every matrix multiplication aten runs, with its operands' and result's dtypes and shapes.

``GemmRecorder`` is a ``TorchDispatchMode``: inside it each ``mm``, ``addmm``, ``bmm`` or
``baddbmm`` (any overload: ``out=``, in place, ``out_dtype``) is recorded as a :class:`Gemm`.
The float32-output overloads (``aten::mm.dtype`` and ``aten::addmm.dtype``, ``torch.mm(...,
out_dtype=torch.float32)``) have CUDA kernels only; on CPU tensors the recorder runs them on the
operands upcast to the output dtype. A product of two bf16 or fp16 numbers is exact in float32,
so the result is a CUDA's up to the order of summation: the code that issues them runs as it
would on a GPU, and its numbers can be compared with a float64 reference.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_GEMMS = {aten.mm, aten.addmm, aten.addmm_, aten.bmm, aten.baddbmm, aten.baddbmm_}
_FLOAT32_OUT = {
    aten.mm.dtype, aten.mm.dtype_out, aten.addmm.dtype, aten.addmm.dtype_out,
}  # fmt: skip


class Gemm(NamedTuple):
    op: str  # e.g. "aten.mm.dtype_out"
    operands: tuple[torch.dtype, ...]  # the two matrices multiplied
    out: torch.dtype
    shapes: tuple[tuple[int, ...], ...]  # the two matrices', then the result's

    def touches(self, size: int) -> bool:
        """Whether a matrix or the result has a dimension of ``size`` (the vocabulary)."""
        return any(size in shape for shape in self.shapes)


def _emulate(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A float32-output GEMM on CPU tensors: the operands upcast, then the plain op."""
    if func in (aten.mm.dtype, aten.mm.dtype_out):
        a, b, out_dtype = args[:3]
        result = torch.mm(a.to(out_dtype), b.to(out_dtype))
    else:
        bias, a, b, out_dtype = args[:4]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        result = torch.addmm(
            bias.to(out_dtype), a.to(out_dtype), b.to(out_dtype), beta=beta, alpha=alpha
        )
    out = kwargs.get("out")
    return result if out is None else out.copy_(result)


class GemmRecorder(TorchDispatchMode):
    """Records the GEMMs run inside it (``.gemms``); runs the float32-output overloads on CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.gemms: list[Gemm] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _FLOAT32_OUT and args[0].device.type == "cpu":
            out = _emulate(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if func.overloadpacket in _GEMMS:
            mats = args[:2] if func.overloadpacket in (aten.mm, aten.bmm) else args[1:3]
            self.gemms.append(
                Gemm(
                    str(func),
                    tuple(m.dtype for m in mats),
                    out.dtype,
                    (*(tuple(m.shape) for m in mats), tuple(out.shape)),
                )
            )
        return out
