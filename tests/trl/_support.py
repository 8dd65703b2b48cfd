"""Shared builders for the TRL adapter tests: tiny trainers and hand-made loss-step inputs.

Everything is built in the test session (no hub, no network). Each trainer gets its own copy of
the same tiny model (same seed), so gradients from two trainers can be compared directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from gmpo_core import gmpo_loss
from gmpo_tasks import successor as toy
from gmpo_tasks.chars import char_tokenizer
from gmpo_tasks.models import qwen2_model
from gmpo_trl import GMPOConfig, GMPOTrainer

TOKENIZER = char_tokenizer()


def make_trainer(
    tmp: Path,
    cls: type = GMPOTrainer,
    config_cls: type = GMPOConfig,
    *,
    model: Any = None,
    dataset: Any = None,
    reward: Any = toy.successor_reward,
    processing_class: Any = None,
    trainer_kwargs: dict[str, Any] | None = None,
    **overrides: Any,
) -> Any:
    """A trainer of ``cls`` on a fresh tiny model (seed 0) with the toy defaults + overrides;
    ``model``, ``dataset``, ``reward`` and ``processing_class`` (the tokenizer) replace the toy's."""
    if config_cls is GMPOConfig:
        overrides.setdefault("gmpo_impl", "plain")
    args = config_cls(**toy.toy_args(str(tmp), **overrides))
    model = model if model is not None else qwen2_model(TOKENIZER, seed=0)
    if args.beta != 0 and not model.config._name_or_path:
        # GRPOTrainer loads the reference model from the policy's path: give it one
        path = Path(tmp) / f"init-{type(model).__name__}"
        model.save_pretrained(path)
        model.config._name_or_path = str(path)
    return cls(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset if dataset is not None else toy.successor_dataset(),
        processing_class=processing_class if processing_class is not None else TOKENIZER,
        **(trainer_kwargs or {}),
    )


def make_inputs(
    trainer: Any,
    *,
    seed: int = 0,
    rows: int = 6,
    prompt_len: int = 3,
    length: int = 6,
    empty_row: bool = False,
    drift: float = 0.0,
    ref_drift: float = 0.0,
    zero_advantage: bool = False,
) -> dict[str, Any]:
    """Loss-step inputs as GRPOTrainer builds them: random prompts and completions of varied
    lengths; ``old_per_token_logps`` = the model's log-probs + N(0, drift) when ``drift`` > 0
    (so the clip acts); ``ref_per_token_logps`` likewise with ``ref_drift``."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(TOKENIZER)
    prompt_ids = torch.randint(2, vocab, (rows, prompt_len), generator=g)
    completion_ids = torch.randint(2, vocab, (rows, length), generator=g)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    if empty_row:
        lengths[1] = 0
    completion_mask = (torch.arange(length) < lengths[:, None]).long()
    advantages = torch.randn(rows, generator=g)
    if zero_advantage:
        advantages[0] = 0.0
    inputs: dict[str, Any] = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
    }
    return with_logps(trainer, inputs, g, drift, ref_drift)


def with_logps(
    trainer: Any, inputs: dict[str, Any], g: torch.Generator, drift: float, ref_drift: float
) -> dict[str, Any]:
    """``inputs`` with old and reference log-probs: the model's own plus N(0, drift²) and
    N(0, ref_drift²) noise from ``g`` (each left out at 0)."""
    logps = model_logps(trainer, inputs)
    if drift:
        inputs["old_per_token_logps"] = logps + drift * torch.randn(logps.shape, generator=g)
    if ref_drift:
        inputs["ref_per_token_logps"] = logps + ref_drift * torch.randn(logps.shape, generator=g)
    return inputs


@torch.no_grad()
def model_logps(trainer: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """The trainer's own log-probs of the completion tokens (B, T)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, attn, inputs["completion_ids"].size(1)
    )
    return logps


def loss_and_grad(
    trainer: Any, inputs: dict[str, Any], *, accumulation: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """One loss step in train mode: the loss and the flat gradient of every trainable parameter."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = accumulation
    loss = trainer._compute_loss(model, dict(inputs))
    loss.backward()
    grads = [
        p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
        for p in model.parameters()
        if p.requires_grad
    ]
    return loss.detach(), torch.cat(grads)


def variant_step(
    trainer: Any, inputs: dict[str, Any], loss_fn: Any, minus: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A variant's loss on the trainer's own log-probs in train mode, as TRL's loss step sees
    them: ``loss_fn(logps, old_per_token_logps, advantages, completion_mask)`` -> (loss,
    clipped); returns the loss, the clipped fraction, the flat gradient and the log-probs.
    ``minus(logps)``: a stated difference subtracted from the loss before the backward pass."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps = trainer._get_per_token_logps_and_entropies(
        model, ids, attn, inputs["completion_ids"].size(1)
    )[0]
    loss, clipped = loss_fn(
        logps, inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"]
    )
    if minus is not None:
        loss = loss - minus(logps)
    loss.backward()
    grads = [
        p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
        for p in model.parameters()
        if p.requires_grad
    ]
    return loss.detach(), clipped, torch.cat(grads), logps.detach()


def last_metrics(trainer: Any, mode: str = "train") -> dict[str, float]:
    """The last value of every metric the loss step logged."""
    return {k: v[-1] for k, v in trainer._metrics[mode].items() if v}


__all__ = [
    "TOKENIZER",
    "GRPOConfig",
    "GRPOTrainer",
    "last_metrics",
    "loss_and_grad",
    "make_inputs",
    "make_trainer",
    "model_logps",
    "variant_step",
]


def tiny_moe() -> Any:
    """A tiny Qwen2-MoE with the router's load-balancing loss on (coefficient 0.05), seeded."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        vocab_size=len(TOKENIZER), hidden_size=32, intermediate_size=64,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, output_router_logits=True, router_aux_loss_coef=0.05,
        pad_token_id=TOKENIZER.pad_token_id, eos_token_id=TOKENIZER.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(config)


RTOL, ATOL = 1e-5, 1e-7  # float32, same model and inputs: only summation order differs


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def expected_loss(trainer, inputs, mask=None, **kwargs) -> torch.Tensor:
    """gmpo_core on the trainer's own log-probs: what the loss step must return."""
    logps = model_logps(trainer, inputs)
    mask = inputs["completion_mask"].bool() if mask is None else mask
    return gmpo_loss(
        logps, inputs.get("old_per_token_logps"), inputs["advantages"], mask, impl="plain",
        **kwargs,
    ).loss  # fmt: skip


def inputs_of(trainer, spec: dict) -> dict:
    spec = dict(spec)
    tool = spec.pop("tool_mask", False)
    inputs = make_inputs(trainer, **spec)
    if tool:
        g = torch.Generator().manual_seed(7)
        inputs["tool_mask"] = (
            torch.rand(inputs["completion_mask"].shape, generator=g) > 0.3
        ).long()
    return inputs


def is_ratio(inputs, mode: str) -> torch.Tensor:
    """vLLM importance-sampling ratios as GRPOTrainer builds them in each mode."""
    g = torch.Generator().manual_seed(3)
    mask = inputs["completion_mask"].float()
    diff = 0.3 * torch.randn(mask.shape, generator=g) * mask  # old - sampling log-probs
    if mode.startswith("sequence"):
        ratio = diff.sum(-1, keepdim=True).exp()  # (B, 1)
    else:
        ratio = diff.exp()  # (B, T)
    if mode.endswith("truncate"):
        return ratio.clamp(max=1.2)
    return ratio.masked_fill(ratio > 1.2, 0.0)  # *_mask: out-of-range ratios are zeroed


IS_MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def enable_is(trainer, mode: str) -> None:
    # use_vllm needs vLLM at construction; the loss step only reads these attributes
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = mode


# --------------------------------------------------------------------------------------------
# a real model's batch: chat prompts of chat_chain_sum, completions sampled from the model
# --------------------------------------------------------------------------------------------


def real_trainer(tmp: Path, model_dir: str, cls: type = GMPOTrainer, config_cls: type = GMPOConfig,
                 **overrides: Any) -> Any:  # fmt: skip
    """A trainer of ``cls`` on the pretrained model in ``model_dir`` (float32, loaded afresh),
    with its own tokenizer and the chat_chain_sum task's dataset and reward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmpo_tasks.chat_chain_sum import TASK

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return make_trainer(
        tmp, cls, config_cls, model=model, dataset=TASK.dataset(0, n=8), reward=TASK.reward,
        processing_class=AutoTokenizer.from_pretrained(model_dir), **overrides,
    )  # fmt: skip


def chat_inputs(
    trainer: Any,
    *,
    seed: int = 0,
    rows: int = 4,
    length: int = 14,
    drift: float = 0.0,
    ref_drift: float = 0.0,
) -> dict[str, Any]:
    """Loss-step inputs on a real chat model, as GRPOTrainer builds them: ``rows`` prompts of
    chat_chain_sum rendered by the tokenizer's chat template (left-padded), completions of up
    to ``length`` tokens sampled from the trainer's model at temperature 1 (right-padded, the
    mask ending at the first end-of-sequence token); row 1's mask is cut to half its length
    (a shorter completion). Advantages N(0, 1) with both signs; old and reference log-probs as
    in :func:`make_inputs`. The same ``seed`` gives the same batch in every process."""
    from gmpo_tasks.chat_chain_sum import TASK

    tok = trainer.processing_class
    texts = [
        tok.apply_chat_template(TASK.messages(e), add_generation_prompt=True, tokenize=False)
        for e in TASK.entries(rows, seed=f"loss-step:{seed}")
    ]
    prompts = tok(texts, return_tensors="pt", padding=True, padding_side="left",
                  add_special_tokens=False)  # fmt: skip
    model = trainer.model
    model.eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
            max_new_tokens=length, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            use_cache=True,  # the trainer turned it off for gradient checkpointing
        )  # fmt: skip
    completion_ids = torch.full((rows, length), tok.pad_token_id, dtype=torch.long)
    sampled = out[:, prompts["input_ids"].size(1) :]
    completion_ids[:, : sampled.size(1)] = sampled
    is_eos = completion_ids == tok.eos_token_id
    ends = torch.where(is_eos.any(1), is_eos.int().argmax(1), length)  # the EOS is a token
    completion_mask = (torch.arange(length) <= ends[:, None]).long()
    completion_mask[1, max(1, int(completion_mask[1].sum()) // 2) :] = 0
    g = torch.Generator().manual_seed(seed)
    advantages = torch.randn(rows, generator=g)
    advantages[:2] = advantages[:2].abs()
    advantages[2:] = -advantages[2:].abs()  # both signs: both sides of the one-sided clip
    inputs: dict[str, Any] = {
        "prompt_ids": prompts["input_ids"],
        "prompt_mask": prompts["attention_mask"],
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
    }
    return with_logps(trainer, inputs, g, drift, ref_drift)


def grad_errors(grad: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Two flat gradients' distance, over every element: the relative L2 error and the largest
    element difference relative to the largest element of ``ref``."""
    diff = grad - ref
    return float(diff.norm() / ref.norm()), float(diff.abs().max() / ref.abs().max())
