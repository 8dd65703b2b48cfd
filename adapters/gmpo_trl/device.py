"""Where a run trains when the user does not say: the one rule that ``GMPOConfig`` and the
``gmpo`` command share.

TRL's ``GRPOConfig`` defaults to ``bf16=True``, which transformers' ``TrainingArguments``
refuses on a machine without a GPU ("Your setup doesn't support bf16/gpu"). Where torch sees no
accelerator, a run therefore trains on the CPU in float32 (``use_cpu=True``, ``bf16=False``);
what the user sets wins. Importing this module imports neither TRL nor torch (``gmpo --help``
reads it); torch is imported when the rule is asked.
"""

from __future__ import annotations

from typing import Any


def has_accelerator() -> bool:
    """Whether torch sees a GPU (CUDA/ROCm), an Apple GPU (MPS) or an Intel GPU (XPU)."""
    import torch

    if torch.cuda.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def cpu_defaults() -> dict[str, Any]:
    """The config values a run gets unless the user sets them: ``use_cpu=True, bf16=False``
    where torch sees no accelerator, else none (TRL's defaults stand)."""
    return {} if has_accelerator() else {"use_cpu": True, "bf16": False}
