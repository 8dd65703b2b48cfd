"""One actor update through verl's real training stack on CPU; run by ``torchrun`` from
``tests/verl/test_engine.py`` and ``verl_cpu/figures.py`` (1 or 2 processes, gloo).

verl's FSDP2 engine (``FSDPEngineWithLMHead``) with its real actor loss (``ppo_loss`` ->
``get_policy_loss_fn``), a tiny Qwen2 model built from a config (no hub), a CPU platform
registered through ``PlatformRegistry`` (``cpu_support.py``) and ``VERL_ENGINE_DEVICE=cuda``
(the engine registry only has accelerator keys). verl beside trl needs nothing here: the
``gmpo_verl.plugin`` entry point applies ``gmpo_verl._trl_compat``. For each loss mode and micro-batch size it reports the gradient norm of
one update of the same global batch (learning rate 0, so the model does not change), then takes
one real step (``--lr``) and reports every row's mean log-prob before and after.

Usage: torchrun --nproc_per_node N engine_worker.py MODEL_DIR OUT_JSON --loss-modes gmpo ...
(a loss mode may name its aggregation: ``gmpo@token-mean``)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from typing import Any

os.environ.setdefault("VERL_PLATFORM", "cpu")
os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

torch.set_num_threads(1)

# verl's "cpu" platform (``cpu_support.py``, beside this script)
from cpu_support import CPUPlatform  # noqa: E402, F401
from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import (  # noqa: E402
    FSDPActorConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    HFModelConfig,
    PolicyLossConfig,
)
from verl.workers.config.checkpoint import CheckpointConfig  # noqa: E402
from verl.workers.engine import EngineRegistry  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

B, P, R, VOCAB = 8, 4, 8, 64  # global batch: sequences, prompt and response widths
RESPONSE_LENGTHS = [8, 3, 6, 8, 1, 5, 7, 4]
FULLY_MASKED_ROW = 5  # its response exists (attended to) but no token is in the loss
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 1.5, 1.0, -1.5, 0.8]


def build_model(path: str) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)


def global_batch() -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses (verl's rollout layout), seeded."""
    g = torch.Generator().manual_seed(1)
    prompt_lengths = torch.tensor([4, 2, 3, 4, 1, 4, 2, 3])
    prompts = torch.randint(3, VOCAB, (B, P), generator=g)
    responses = torch.randint(3, VOCAB, (B, R), generator=g)
    prompt_mask = torch.arange(P)[None, :] >= (P - prompt_lengths)[:, None]
    response_attn = torch.arange(R)[None, :] < torch.tensor(RESPONSE_LENGTHS)[:, None]
    prompts[~prompt_mask] = 0
    responses[~response_attn] = 0
    attention_mask = torch.cat([prompt_mask, response_attn], 1).long()
    response_mask = response_attn.clone()
    response_mask[FULLY_MASKED_ROW] = False
    advantages = torch.tensor(ADVANTAGES)[:, None] * response_mask
    # rollout-correction weights (verl's rollout_is_weights), one valid token's weight exactly 0
    weights = torch.exp(0.2 * torch.randn(B, R, generator=g)) * response_mask
    weights[0, 2] = 0.0
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask.long(),
        "advantages": advantages,
        "old_noise": 0.3 * torch.randn(B, R, generator=g),  # off-policy ratios, some clipped
        "weights": weights,
    }


def to_engine(rows: dict[str, torch.Tensor], extra: dict[str, torch.Tensor], micro: int,
              global_size: int, max_tokens: int = 0) -> TensorDict:  # fmt: skip
    """A rank's share in verl's no-padding layout, with what the trainer and worker attach.
    ``max_tokens > 0``: verl's dynamic batch size (token-balanced, uneven micro-batches)."""
    td = TensorDict(
        {k: v for k, v in rows.items() if k not in ("old_noise", "weights")} | extra,
        batch_size=[len(rows["prompts"])],
    )
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(
        td, temperature=1.0, global_batch_size=global_size, micro_batch_size_per_gpu=micro,
        use_dynamic_bsz=max_tokens > 0, use_remove_padding=False, use_fused_kernels=False,
        max_token_len_per_gpu=max_tokens or 4096, calculate_entropy=False, compute_loss=True,
    )  # fmt: skip
    return td


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--loss-modes", nargs="+", default=["gmpo"])
    parser.add_argument("--micro", type=int, nargs="+", default=[1])  # micro-batches per rank
    parser.add_argument("--dynamic-tokens", type=int, default=0)  # also a dynamic-bsz split
    parser.add_argument("--step", action="store_true")  # then one real update
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if rank == 0 and not os.path.exists(os.path.join(args.model_dir, "config.json")):
        build_model(args.model_dir)
    torch.distributed.barrier()

    model_config = HFModelConfig(
        path=args.model_dir, load_tokenizer=False, use_remove_padding=False,
        enable_gradient_checkpointing=False, override_config={"attn_implementation": "sdpa"},
    )  # fmt: skip
    engine_config = FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False, seed=0)
    optim = FSDPOptimizerConfig(lr=1.0, clip_grad=1e9, weight_decay=0.0, total_training_steps=10)
    model_config.model_type = "language_model"
    engine = EngineRegistry.new(
        model_type="language_model", backend="fsdp2", model_config=model_config,
        engine_config=engine_config, optimizer_config=optim, checkpoint_config=CheckpointConfig(),
    )  # fmt: skip
    engine.initialize()

    batch = global_batch()
    share = B // world
    mine = {k: v[rank * share : (rank + 1) * share] for k, v in batch.items()}

    def row_log_probs() -> torch.Tensor:
        td = to_engine(mine, {}, share, B)
        tu.assign_non_tensor(td, compute_loss=False)
        with engine.eval_mode():
            out = engine.infer_batch(td)
        return no_padding_2_padding(out["model_output"]["log_probs"], td).float()  # (share, R)

    def set_lr(lr: float) -> None:
        for group in engine.optimizer.param_groups:
            group["lr"] = lr

    def actor_loss(spec: str) -> Any:
        """``loss_mode`` or ``loss_mode@loss_agg_mode`` (default seq-mean-token-mean)."""
        loss_mode, _, agg = spec.partition("@")
        config = FSDPActorConfig(
            strategy="fsdp2", rollout_n=1, ppo_mini_batch_size=B, ppo_micro_batch_size_per_gpu=1,
            clip_ratio_low=0.4, clip_ratio_high=0.4, loss_agg_mode=agg or "seq-mean-token-mean",
            policy_loss=PolicyLossConfig(loss_mode=loss_mode), use_torch_compile=False,
        )  # fmt: skip
        return partial(ppo_loss, config=config)  # what verl's ActorWorker installs as its loss_fn

    logp0 = row_log_probs()
    old = logp0 + mine["old_noise"]
    results: dict[str, Any] = {"world_size": world, "grad_norm": {}, "pg_loss": {}}
    for loss_mode in args.loss_modes:
        splits = [(str(k), share // k, 0) for k in args.micro]
        if args.dynamic_tokens:
            splits.append(("dynamic", 1, args.dynamic_tokens))
        for key, micro, max_tokens in splits:  # learning rate 0: the same model every time
            set_lr(0.0)
            extra = {"old_log_probs": old, "rollout_is_weights": mine["weights"]}
            td = to_engine(mine, extra, micro, B, max_tokens)
            with engine.train_mode():
                out = engine.train_batch(td, loss_function=actor_loss(loss_mode))
            results["grad_norm"][f"{loss_mode}/{key}"] = float(out["metrics"]["grad_norm"])
            results["pg_loss"][f"{loss_mode}/{key}"] = out["metrics"]["actor/pg_loss"].values
    if args.step:  # one real update, on-policy, with the first loss mode
        set_lr(args.lr)
        td = to_engine(mine, {"old_log_probs": logp0}, share, B)
        with engine.train_mode():
            engine.train_batch(td, loss_function=actor_loss(args.loss_modes[0]))
        logp1 = row_log_probs()
        mask = mine["response_mask"].bool()
        n = mask.sum(1).clamp(min=1)
        before = (torch.where(mask, logp0, 0).sum(1) / n).tolist()
        after = (torch.where(mask, logp1, 0).sum(1) / n).tolist()
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, (before, after))
        results["row_log_prob"] = {
            "before": [x for g in gathered for x in g[0]],
            "after": [x for g in gathered for x in g[1]],
        }
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results | {"advantages": ADVANTAGES, "masked_row": FULLY_MASKED_ROW}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
