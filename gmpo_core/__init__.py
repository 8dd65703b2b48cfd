"""gmpo_core: Geometric-Mean Policy Optimization as pure functions of tensors.

``gmpo_loss`` is the objective of arXiv 2507.20673 (Eq. 4); the building blocks it is composed
of are public so that variants (the paper's ablations) take a few lines each. ``reference`` is an
independent float64 NumPy implementation of the same contract, used by the tests.
``token_logprobs`` computes the sampled tokens' log-probs and entropies from hidden states and the
LM-head weight in chunks, never holding the (N, V) logits.
"""

from gmpo_core.lm_head import TokenLogProbs, token_logprobs
from gmpo_core.loss import GMPOOutput, gmpo_loss
from gmpo_core.metrics import ClipStats
from gmpo_core.ops import (
    clip_log_ratio,
    clip_metrics,
    masked_geometric_mean,
    sequence_kl,
    trust_region_log_ratio,
)

__all__ = [
    "ClipStats",
    "GMPOOutput",
    "TokenLogProbs",
    "clip_log_ratio",
    "clip_metrics",
    "gmpo_loss",
    "masked_geometric_mean",
    "sequence_kl",
    "token_logprobs",
    "trust_region_log_ratio",
]
__version__ = "0.1.0"
