"""The hosts' own GMPO losses, as the loss benchmark runs them: TRL's (transcribed: TRL computes
it inside a trainer method) and verl's ``compute_policy_loss_geo_mean`` (called as installed).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

EPSILON = 0.4  # log-space clip, both sides: the paper's exp(+-0.4), TRL's and verl's setting here


def trl_gmpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float = EPSILON,
    epsilon_high: float = EPSILON,
    beta: float = 0.0,
    ref_per_token_logps: Tensor | None = None,
    entropy_mask: Tensor | None = None,
    current_gradient_accumulation_steps: int = 1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """TRL 1.16.0's GMPO loss and metric tensors (TRL's defaults: ``beta = 0``, no entropy mask).

    Between the markers: a transcription of lines 80-153 of
    ``trl/experimental/gmpo/gmpo_trainer.py`` (``GMPOTrainer._compute_loss``) in trl 1.16.0,
    Copyright 2020-2026 The HuggingFace Team, licensed under the Apache License, Version 2.0.
    Changes: the ``self.`` attributes and ``inputs[...]`` entries are arguments; the model is in
    training mode; the accelerator ``reduce``/``gather`` calls and the host calls (``.item()``,
    ``nanmin``, ``nanmax``) are left out, keeping the metric tensors; the entropy metric is left out
    (its input comes from the model). ``mask`` is what TRL passes: ``completion_mask``, an int64
    tensor in trl 1.16.

    Shape:
        per_token_logps, old_per_token_logps, mask, ref_per_token_logps, entropy_mask: (B, T).
        advantages: (B,).
    """
    if beta != 0.0 and ref_per_token_logps is None:
        raise ValueError("trl_gmpo_loss: beta != 0 needs ref_per_token_logps")
    # Verbatim but for the changes above, so the lines are as long as TRL's (up to 120).
    # fmt: off
    # ---- begin transcription: trl 1.16.0, trl/experimental/gmpo/gmpo_trainer.py, L80-153 ----
    # GMPO Objective
    # Per-token log importance ratio
    log_ratio = per_token_logps - old_per_token_logps

    # Token-level clipping, performed in *log space* for numerical stability. The clip range in
    # ratio space is (exp(-epsilon_low), exp(epsilon_high)); the paper recommends exp(±0.4), markedly wider than
    # GRPO/DAPO, to encourage exploration.
    clamped_log_ratio = torch.clamp(log_ratio, min=-epsilon_low, max=epsilon_high)

    # sign-aware, one-sided clipping = PPO's trust-region "min" trick written in log-spaces:
    advantages_col = advantages.unsqueeze(1)
    clipped_log_ratio = torch.where(
        advantages_col > 0,
        torch.minimum(log_ratio, clamped_log_ratio),
        torch.maximum(log_ratio, clamped_log_ratio),
    )

    # Optionally drop low-entropy tokens from the geometric mean
    seq_mask = mask * entropy_mask if entropy_mask is not None else mask

    # Geometric mean of the clipped token ratios = exp(mean of clipped log-ratios over valid tokens). The 1/|o_i|
    # exponent is the geometric-mean normalization; the paper's ablation shows it is essential.
    log_importance_weights = (clipped_log_ratio * seq_mask).sum(-1) / seq_mask.sum(-1).clamp(min=1.0)  # (B,)
    coef = torch.exp(log_importance_weights)  # (B,) sequence-level (geometric-mean) importance weight

    per_sequence_loss = -coef * advantages  # (B,)

    # KL regularization toward the reference model (optional; sequence-averaged to match GMPO's sequence-level
    # objective). Disabled by default (beta == 0)
    if beta != 0.0:
        per_token_kl = (
            torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        )
        seq_kl = (per_token_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        per_sequence_loss = per_sequence_loss + beta * seq_kl

    # GMPO aggregates with a plain mean over sequences, per token-norm
    # already lives inside the geometric mean.
    loss = per_sequence_loss.mean()
    normalizer = current_gradient_accumulation_steps  # mode == "train"
    loss = loss / normalizer

    # Log the metrics
    def masked_seq_mean(x):
        if x.shape[1] == 1:  # when importance_sampling_level == "sequence": already one value per sequence
            return x.squeeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)

    def global_masked_mean(x):
        if x.shape[1] == 1:  # when importance_sampling_level == "sequence": one value per sequence
            local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
        else:
            local_sum, local_count = (x * mask).sum(), mask.sum().float()
        totals = torch.stack([local_sum, local_count])  # accelerator.reduce(..., reduction="sum") left out
        return totals[0] / totals[1].clamp(min=1.0)  # .item() left out

    metrics = {}
    if beta != 0.0:
        metrics["kl"] = global_masked_mean(per_token_kl)

    # (the entropy metric, global_masked_mean(entropies), is left out: entropies come from the model)

    # Fraction of the tokens pushed into the clipped region, in log-space.
    is_low_clipped = (log_ratio < -epsilon_low) & (advantages_col < 0)
    is_high_clipped = (log_ratio > epsilon_high) & (advantages_col > 0)
    is_region_clipped = is_low_clipped | is_high_clipped
    metrics["clip_ratio/low_mean"] = global_masked_mean(is_low_clipped.float())
    metrics["clip_ratio/high_mean"] = global_masked_mean(is_high_clipped.float())
    metrics["clip_ratio/region_mean"] = global_masked_mean(is_region_clipped.float())
    gathered_low_clip = masked_seq_mean(is_low_clipped.float())  # accelerator.gather left out
    metrics["clip_ratio/low_min"] = gathered_low_clip  # nanmin(...).item() left out
    gathered_high_clip = masked_seq_mean(is_high_clipped.float())  # accelerator.gather left out
    metrics["clip_ratio/high_max"] = gathered_high_clip  # nanmax(...).item() left out
    # ---- end transcription ----
    # fmt: on
    return loss, metrics


def verl_geo_mean() -> Any:
    """verl's ``compute_policy_loss_geo_mean`` (raises ImportError without verl)."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_geo_mean

    return compute_policy_loss_geo_mean


def verl_config(batch: int, tokens: int) -> SimpleNamespace:
    """The actor config verl passes: the clip and the global mini-batch of this call."""
    info = {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": batch}
    return SimpleNamespace(
        clip_ratio=EPSILON, clip_ratio_low=EPSILON, clip_ratio_high=EPSILON, global_batch_info=info
    )
