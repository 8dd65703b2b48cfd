"""The hosts' own GMPO losses, as the loss benchmark runs them, transcribed so that the benchmark
runs where neither host is installed (the GPU machine): TRL's (TRL computes it inside a trainer
method) and verl's ``compute_policy_loss_geo_mean`` (tests/verl/test_hosts_transcription.py checks
the transcription against verl's own function where verl is installed).
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


def _verl_masked_mean(values: Tensor, mask: Tensor, axis: Any = None) -> Tensor:
    """verl 0.9.1's ``verl.utils.torch_functional.masked_mean`` (with its ``masked_sum``).

    Between the markers: lines 290-291 and 307-308 of ``verl/utils/torch_functional.py`` in verl
    0.9.1, Copyright 2024 Bytedance Ltd. and/or its affiliates, licensed under the Apache License,
    Version 2.0. Change: ``masked_sum(values, mask, axis)`` inlined as ``s``.
    """
    # fmt: off
    # ---- begin transcription: verl 0.9.1, verl/utils/torch_functional.py, L290-291, L307-308 ----
    valid_values = torch.where(mask.bool(), values, 0.0)
    s = (valid_values * mask).sum(axis=axis)
    return s / (mask.sum(axis=axis) + 1e-8)
    # ---- end transcription ----
    # fmt: on


def verl_geo_mean_loss(  # verl's PolicyLossFn signature, as gmpo_verl's loss functions have it
    old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
    loss_agg_mode: str = "token-mean", config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:  # fmt: skip
    """verl 0.9.1's ``compute_policy_loss_geo_mean`` (``loss_mode=geo_mean``), same signature.

    Between the markers: a transcription of lines 1957-2011 of ``verl/trainer/ppo/core_algos.py``
    in verl 0.9.1, Copyright 2024 Bytedance Ltd. and/or its affiliates, licensed under the Apache
    License, Version 2.0. Changes: ``assert not isinstance(config, AlgoConfig)`` (a verl class) is
    left out; ``verl_F.masked_mean`` is :func:`_verl_masked_mean`. Kept as verl has them: the
    three ``.item()`` calls (three host-device synchronizations a call) and the unused
    ``loss_agg_mode`` and ``config.global_batch_info``.

    Shape:
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights: (B, T).
    """
    # fmt: off
    # ---- begin transcription: verl 0.9.1, verl/trainer/ppo/core_algos.py, L1957-2011 ----
    assert config is not None
    clip_ratio = config.clip_ratio  # Clipping parameter. See https://arxiv.org/abs/1707.06347.
    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio

    cliprange = clip_ratio
    cliprange_low = clip_ratio_low
    cliprange_high = clip_ratio_high
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange

    negative_approx_kl = log_prob - old_log_prob
    # Clamp negative_approx_kl for stability (uncomment it if you like)
    # negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ppo_kl = _verl_masked_mean(-negative_approx_kl, response_mask)

    # Clipping at token-level & Clipping wider
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -cliprange_low, cliprange_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min

    # Geometric-Mean Policy Optimization
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    # we only support sequence level advantage for now,
    # otherwise, below would be not consistent with the paper
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_losses = -advantage * ratio

    # Apply rollout correction weights if provided
    # For geo_mean, IS weights are 2D (batch_size, seq_length) and need to be aggregated to sequence level
    if rollout_is_weights is not None:
        # Aggregate token-level weights to sequence level using geometric mean for consistency
        # Note: rollout_is_weights is always 2D regardless of aggregation mode
        seq_is_weights = torch.exp(
            (torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
        )
        pg_losses = pg_losses * seq_is_weights

    pg_loss = torch.mean(pg_losses)

    # higher: ratio is too large that need clamp to clip_high (when adv > 0)
    clipped = torch.ne(negative_approx_kl, negative_approx_kl_clamp)
    pg_clipfrac = _verl_masked_mean((clipped * (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = _verl_masked_mean((clipped * (advantages < 0)).float(), response_mask)
    pg_metrics = {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }
    return pg_loss, pg_metrics
    # ---- end transcription ----
    # fmt: on


def verl_config(batch: int, tokens: int) -> SimpleNamespace:
    """The actor config verl passes: the clip and the global mini-batch of this call."""
    info = {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": batch}
    return SimpleNamespace(
        clip_ratio=EPSILON, clip_ratio_low=EPSILON, clip_ratio_high=EPSILON, global_batch_info=info
    )
