"""Every ``trl.GRPOConfig`` field, and what ``gmpo_trl`` does with it.

Each field is tagged

- ``honoured``: it shapes the loss step, and ``GMPOTrainer`` implements it (the note says how);
- ``rejected``: it shapes the loss in a way that has no meaning for GMPO, or that GMPO does not
  implement; a user-set value is refused at construction with a ``ValueError`` (the note says
  why, and which values are accepted);
- ``irrelevant``: it does not reach the loss step (generation, rewards, logging, saving, the
  optimizer, distribution...): GRPOTrainer handles it unchanged.

``tests/trl/test_config.py`` fails when the installed TRL's ``GRPOConfig`` declares a field this
table does not know (a field it inherits unchanged from ``transformers.TrainingArguments`` never
reaches the loss step and needs no entry), and when the source of ``GRPOTrainer._compute_loss`` is
none of the reviewed ones (``gmpo_trl.compat.KNOWN_COMPUTE_LOSS_SHA256``), so that a TRL upgrade
is reviewed, not silently absorbed; ``GMPOTrainer`` warns on an unknown one. ``docs/trl.md``
renders the table. :data:`GMPO_FIELDS` is the other table: the fields ``GMPOConfig`` declares
itself (their defaults and help, which ``gmpo train --help`` reads without importing TRL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gmpo_core.options import EPSILON

Tag = Literal["honoured", "rejected", "irrelevant"]

_H: Tag = "honoured"
_R: Tag = "rejected"
_I: Tag = "irrelevant"

#: field name -> (tag, note)
FIELDS: dict[str, tuple[Tag, str]] = {
    # --- the GMPO objective ------------------------------------------------------------------
    "epsilon": (_H, "log-space lower clip: ratio lower bound exp(-epsilon); GMPO default 0.4"),
    "epsilon_high": (_H, "log-space upper clip (None: epsilon)"),
    "delta": (_H, "gmpo_core's dual_clip: cap on the ratio of negative-advantage tokens; > 1"),
    "beta": (_H, "sequence-level k3 KL to the reference model, token mean per row"),
    "loss_type": (
        _R,
        "only 'gmpo' (the default): GMPO's aggregation is the geometric mean per sequence, "
        "so no other aggregation applies; ablations are in docs/recipes.md",
    ),
    "importance_sampling_level": (
        _R,
        "only 'token': GMPO clips per token, then takes the geometric mean; the sequence-level "
        "clip ablation is `sequence_clip_loss` in docs/recipes.md",
    ),
    "use_bias_correction_kl": (
        _R,
        "only False: the ratio-weighted per-token KL has no sequence-level form in gmpo_core",
    ),
    # --- host terms and masks, honoured -------------------------------------------------------
    "num_iterations": (_H, "old log-probs from the host: the ratio is logp - old_logp"),
    "steps_per_generation": (_H, "off-policy micro-batches use the host's old log-probs"),
    "gradient_accumulation_steps": (_H, "per-sequence mean divided by the accumulation steps"),
    "top_entropy_quantile": (
        _H,
        "GRPOTrainer.get_high_entropy_mask restricts the policy term's tokens (KL keeps all)",
    ),
    "entropy_coef": (_H, "entropy bonus, as GRPOTrainer adds it"),
    "use_adaptive_entropy": (_H, "GRPOTrainer's adaptive entropy controller, same state"),
    "entropy_coef_min": (_H, "adaptive entropy controller"),
    "entropy_coef_max": (_H, "adaptive entropy controller"),
    "entropy_coef_delta": (_H, "adaptive entropy controller"),
    "entropy_target": (_H, "adaptive entropy controller"),
    "router_aux_loss_coef": (_H, "MoE router aux loss added as GRPOTrainer adds it"),
    "off_policy_mask_threshold": (
        _H,
        "GRPOTrainer.get_off_policy_mask drops rows from the policy term (KL keeps them)",
    ),
    "use_vllm": (_H, "with the IS correction: vLLM ratios are gmpo_core's is_weights"),
    "vllm_importance_sampling_correction": (_H, "ratios passed as gmpo_core's is_weights"),
    "vllm_importance_sampling_mode": (
        _H,
        "sequence_*: a row weight; token_truncate: geometric mean over the row; token_mask: "
        "zero-weight tokens leave the row",
    ),
    "vllm_importance_sampling_clip_max": (_H, "applied by the host when it builds the ratios"),
    "vllm_importance_sampling_clip_min": (_H, "applied by the host when it builds the ratios"),
    "vllm_importance_sampling_cap": (_H, "deprecated alias of vllm_importance_sampling_clip_max"),
    "use_liger_kernel": (_H, "patches model layers only in trl 1.16; the loss is unchanged"),
    "liger_kernel_config": (_H, "layer patching only (fused linear cross-entropy is refused)"),
    "bf16": (_H, "log-probs in bf16 are computed in float32 by gmpo_core"),
    "fp16": (_H, "log-probs in fp16 are computed in float32 by gmpo_core"),
    "cast_lm_head_to_fp32": (_H, "the host's LM head precision; the loss reads its log-probs"),
    "mask_truncated_completions": (_H, "the host zeroes the completion mask: an empty row is 0"),
    "sync_ref_model": (_H, "the host updates the reference model that beta's KL reads"),
    "ref_model_mixup_alpha": (_H, "reference-model sync (host)"),
    "ref_model_sync_steps": (_H, "reference-model sync (host)"),
    "max_tool_calling_iterations": (_H, "tool-result tokens leave the row through tool_mask"),
}

#: fields that only another loss_type reads: a user-set (non-default) value is refused, since it
#: would change nothing under GMPO (field -> that loss_type)
OTHER_LOSS_FIELDS: dict[str, str] = {
    "sapo_temperature_neg": "sapo",
    "sapo_temperature_pos": "sapo",
    "vespo_k_pos": "vespo",
    "vespo_lambda_pos": "vespo",
    "vespo_k_neg": "vespo",
    "vespo_lambda_neg": "vespo",
}
for _name, _loss in OTHER_LOSS_FIELDS.items():
    FIELDS[_name] = (_R, f"only the default: used by loss_type='{_loss}' only")

# Fields that never reach the loss step: generation, rewards, data, logging, saving, the optimizer
# and the distributed set-up (GRPOTrainer and transformers.Trainer handle them unchanged).
_IRRELEVANT = """
model_init_kwargs trust_remote_code disable_dropout num_generations num_generations_eval
max_completion_length ds3_gather_for_generation shuffle_dataset pad_to_multiple_of
generation_batch_size temperature top_p top_k min_p generation_kwargs chat_template_kwargs
repetition_penalty cache_implementation vllm_mode vllm_model_impl vllm_enable_sleep_mode
vllm_structured_outputs_regex vllm_server_base_url vllm_server_host vllm_server_port
vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length
vllm_tensor_parallel_size reward_weights multi_objective_aggregation scale_rewards
log_completions log_multimodal num_completions_to_print log_unique_prompts
log_completions_hub_repo use_transformers_continuous_batching
transformers_continuous_batching_config use_transformers_paged
output_dir per_device_train_batch_size num_train_epochs max_steps learning_rate
lr_scheduler_type lr_scheduler_kwargs warmup_steps optim optim_args weight_decay adam_beta1
adam_beta2 adam_epsilon optim_target_modules average_tokens_across_devices max_grad_norm
label_smoothing_factor bf16_full_eval fp16_full_eval tf32 gradient_checkpointing
gradient_checkpointing_kwargs torch_compile torch_compile_backend torch_compile_mode use_cache
neftune_noise_alpha torch_empty_cache_steps auto_find_batch_size logging_strategy logging_steps
logging_first_step log_on_each_node logging_nan_inf_filter include_num_input_tokens_seen
log_level log_level_replica disable_tqdm report_to run_name project trackio_space_id
trackio_bucket_id trackio_static_space_id eval_strategy eval_steps eval_delay
per_device_eval_batch_size prediction_loss_only eval_on_start eval_do_concat_batches
eval_use_gather_object eval_accumulation_steps include_for_metrics batch_eval_metrics
save_only_model save_strategy save_steps save_on_each_node save_total_limit
enable_jit_checkpoint push_to_hub hub_token hub_private_repo hub_model_id hub_strategy
hub_always_push hub_revision load_best_model_at_end metric_for_best_model greater_is_better
ignore_data_skip restore_callback_states_from_checkpoint full_determinism seed data_seed
use_cpu accelerator_config parallelism_config dataloader_drop_last dataloader_num_workers
dataloader_pin_memory dataloader_persistent_workers dataloader_prefetch_factor
remove_unused_columns label_names train_sampling_strategy length_column_name
ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph ddp_backend
ddp_timeout fsdp fsdp_config deepspeed debug skip_memory_metrics do_train do_eval do_predict
resume_from_checkpoint warmup_ratio logging_dir local_rank
""".split()

for _name in _IRRELEVANT:
    FIELDS.setdefault(_name, (_I, "does not reach the loss step"))


@dataclass(frozen=True)
class Option:
    """One of ``GMPOConfig``'s own options: its default and help text (the dataclass field's, and
    ``gmpo train --help``'s). ``added``: GRPOConfig has no such field. ``fixed``: GMPO accepts
    one value only (``--help`` does not list it). ``aliases``: other option names of the
    command line (``--variant``). ``brief``: ``--help`` lists it (False: ``--help-all`` only,
    an option few runs set)."""

    default: object
    help: str
    added: bool = False
    fixed: bool = False
    aliases: tuple[str, ...] = ()
    brief: bool = True


#: The fields ``GMPOConfig`` declares (GRPOConfig's own default and help replaced, or added), in
#: ``--help``'s order: the one source of their defaults and help (pure Python: ``--help`` reads
#: it without importing TRL). The impl names are ``gmpo_core.options.IMPLS``.
GMPO_FIELDS: dict[str, Option] = {
    "epsilon": Option(
        EPSILON,
        "Lower clip in log space: the token ratio's lower bound is exp(-epsilon). "
        "GMPO recommends 0.4.",
    ),
    "epsilon_high": Option(
        None,
        "Upper clip in log space: the token ratio's upper bound is exp(epsilon_high). "
        "None means epsilon.",
    ),
    "delta": Option(
        None,
        "GMPO's dual clip: caps the ratio of negative-advantage tokens at delta (> 1), as GRPO's "
        "delta does. None: off.",
    ),
    "gmpo_impl": Option(
        "plain",
        "gmpo_core path: 'plain' (plain PyTorch, no compilation) or 'compiled' (torch.compile; "
        "compiles on the first step, see docs/api.md for when it pays). TRL's torch_compile "
        "does not switch it on.",
        added=True,
    ),
    "gmpo_lm_head": Option(
        None,
        "The LM head that scores tokens. Unset: gmpo_core.token_logprobs on the CPU (faster and "
        "leaner there), TRL's chunked head on a GPU (faster there, on paper); true or false: "
        "gmpo_core's or TRL's everywhere (docs/lm_head.md).",
        added=True,
    ),
    "gmpo_lm_head_backward": Option(
        "half",
        "gmpo_lm_head's backward GEMMs in bf16/fp16 on CUDA: 'half' (TRL's precision) or "
        "'float32' (docs/lm_head.md).",
        added=True,
        brief=False,
    ),
    "loss_variant": Option(
        None,
        "A loss variant in place of gmpo_core's loss: a name of gmpo_variants.VARIANTS "
        "(e.g. 'gmpo_narrow') or module:function, (logp, old_logp, advantages, mask) -> loss or "
        "(loss, clipped fraction). Its clip is its own, so epsilon, epsilon_high, delta, beta, "
        "gmpo_impl and vLLM's importance-sampling correction are refused with it. Also "
        "--variant. None: GMPO.",
        added=True,
        aliases=("--variant",),
    ),
    "loss_type": Option(
        "gmpo",
        "Always 'gmpo': the geometric mean of the clipped token ratios per sequence, then the "
        "mean over sequences. Other values are refused; see docs/recipes.md.",
        fixed=True,
    ),
    "use_bias_correction_kl": Option(
        False,
        "Always False under GMPO (GRPOConfig's default is True): the KL is gmpo_core's "
        "sequence-level k3 estimator, which has no ratio-weighted form. True is refused.",
        fixed=True,
    ),
}


def markdown_table() -> str:
    """The table as Markdown (what docs/trl.md shows): honoured and rejected fields with their
    notes, then the irrelevant ones as a list."""
    order = {"honoured": 0, "rejected": 1}
    rows = sorted(
        ((n, t, note) for n, (t, note) in FIELDS.items() if t != "irrelevant"),
        key=lambda r: (order[r[1]], r[0]),
    )
    lines = ["| field | tag | what gmpo_trl does |", "|---|---|---|"]
    lines += [f"| `{name}` | {tag} | {note} |" for name, tag, note in rows]
    lines += [
        "",
        "Irrelevant to the loss step (handled by GRPOTrainer / transformers unchanged):",
        "",
    ]
    irrelevant = sorted(n for n, (t, _) in FIELDS.items() if t == "irrelevant")
    lines.append(", ".join(f"`{n}`" for n in irrelevant) + ".")
    return "\n".join(lines)
