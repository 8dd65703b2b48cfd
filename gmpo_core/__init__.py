"""gmpo_core: Geometric-Mean Policy Optimization as pure functions of tensors.

``gmpo_loss`` is the objective of arXiv 2507.20673 (Eq. 4); the building blocks it is composed
of are public so that variants (the paper's ablations) take a few lines each. ``reference`` is an
independent float64 NumPy implementation of the same contract, used by the tests.
``token_logprobs`` computes the sampled tokens' log-probs and entropies from hidden states and the
LM-head weight in chunks, never holding the (N, V) logits.

The public names load on first use, so that ``gmpo_core.options`` (the option names and
hyper-parameter rules, pure Python) imports without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gmpo_core.lm_head import TokenLogProbs, token_logprobs
    from gmpo_core.loss import GMPOOutput, gmpo_loss
    from gmpo_core.metrics import ClipStats
    from gmpo_core.ops import (
        clip_log_ratio,
        clip_metrics,
        masked_geometric_mean,
        masked_power_mean,
        sequence_kl,
        trust_region_log_ratio,
    )

_HOMES = {
    "ClipStats": "metrics",
    "GMPOOutput": "loss",
    "TokenLogProbs": "lm_head",
    "clip_log_ratio": "ops",
    "clip_metrics": "ops",
    "gmpo_loss": "loss",
    "masked_geometric_mean": "ops",
    "masked_power_mean": "ops",
    "sequence_kl": "ops",
    "token_logprobs": "lm_head",
    "trust_region_log_ratio": "ops",
}
__all__ = [
    "ClipStats",
    "GMPOOutput",
    "TokenLogProbs",
    "clip_log_ratio",
    "clip_metrics",
    "gmpo_loss",
    "masked_geometric_mean",
    "masked_power_mean",
    "sequence_kl",
    "token_logprobs",
    "trust_region_log_ratio",
]
__version__ = "0.3.0.dev0"


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(f"gmpo_core.{_HOMES[name]}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'gmpo_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
