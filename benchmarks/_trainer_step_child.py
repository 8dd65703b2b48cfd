"""bench_trainer_step.py's child process: one variant's GMPOTrainer step on a fixed batch, in a fresh process (the parent runs it as ``bench_trainer_step.py --_child VARIANT``)."""

from __future__ import annotations

import argparse
import gc
import math
import os
import tempfile
import time
import zlib
from typing import Any

from _common import (
    proc_status_kib,
    reset_peak_rss,
)

PROMPT_LEN = 2  # the toy prompts "d=" are two characters, two tokens


# --------------------------------------------------------------------------------------------
# child: one variant, one fresh process


def hash_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """A deterministic reward in [0, 1) with spread (so advantages are not all zero)."""
    return [zlib.crc32(c.encode()) % 1000 / 1000 for c in completions]


def fixed_batch(batch: int, completion: int, vocab: int, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(2, vocab, (batch, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(2, vocab, (batch, completion), generator=g)
    # behaviour log-probs near the random model's own (about -ln V), spread by N(0, 0.2): the
    # ratio then differs from 1 and the clip acts, so the loss VALUE depends on the head's
    # log-probs (on-policy it is -mean(advantages) whatever they are)
    old = -math.log(vocab) + 0.2 * torch.randn(batch, completion, generator=g)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones_like(completion_ids),
        "advantages": torch.randn(batch, generator=g),
        "old_per_token_logps": old,
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from transformers import TrainerCallback

    from gmpo_tasks import successor as toy
    from gmpo_tasks.chars import char_tokenizer
    from gmpo_tasks.models import qwen2_model
    from gmpo_trl import GMPOConfig, GMPOTrainer

    t_setup = time.perf_counter()
    tokenizer = char_tokenizer(vocab_size=args.vocab)
    model = qwen2_model(
        tokenizer,
        seed=args.seed,
        hidden_size=args.hidden,
        layers=args.layers,
        max_len=PROMPT_LEN + args.completion,
    )
    # the trainer's output_dir, inside the parent's temporary directory (removed with it)
    tmp = tempfile.mkdtemp(prefix="out_", dir=os.path.dirname(os.path.abspath(args.save)))
    config = GMPOConfig(
        **toy.toy_args(
            tmp,
            seed=args.seed,
            per_device_train_batch_size=args.batch,
            num_generations=args.generations,
            max_completion_length=args.completion,
            max_steps=1 + args.train_repeats,
            gmpo_lm_head=args.variant == "gmpo",
            gmpo_impl=args.gmpo_impl,
        )
    )
    trainer = GMPOTrainer(
        model=model,
        reward_funcs=hash_reward,
        args=config,
        train_dataset=toy.successor_dataset(),
        processing_class=tokenizer,
    )
    out: dict[str, Any] = {
        "setup_s": time.perf_counter() - t_setup,
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
    }

    # ---- 1. loss step on a fixed batch: compute_loss + backward
    batch = fixed_batch(args.batch, args.completion, args.vocab, args.seed + 1)
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # as Trainer.train sets it

    def loss_step() -> tuple[Any, float, float]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = trainer.compute_loss(model, dict(batch))
        t1 = time.perf_counter()
        trainer.accelerator.backward(loss)
        return loss.detach(), t1 - t0, time.perf_counter() - t1

    for _ in range(args.warmup):
        loss_step()
    scored: dict[str, Any] = {}  # the first timed step's log-probs and entropies, for the parent
    score = trainer._get_per_token_logps_and_entropies

    def capture(*a: Any, **k: Any) -> Any:
        logps, entropies, aux = score(*a, **k)
        if not scored:
            scored.update(logps=logps.detach().clone(), entropies=entropies.detach().clone())
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = capture
    fwd, bwd, total, peaks = [], [], [], []
    for rep in range(args.repeats):
        gc.collect()
        rss = reset_peak_rss()
        loss, f, b = loss_step()
        peaks.append((proc_status_kib("VmHWM") - rss) * 1024)
        fwd.append(f)
        bwd.append(b)
        total.append(f + b)
        if rep == 0:
            grads = [
                torch.zeros(p.numel()) if p.grad is None else p.grad.detach().reshape(-1)
                for p in model.parameters()
            ]
            torch.save({"loss": loss, "grad": torch.cat(grads), **scored}, args.save)
            trainer._get_per_token_logps_and_entropies = score
            out["loss"] = float(loss)
            out["entropy_metric"] = trainer._metrics["train"]["entropy"][-1]
    model.zero_grad(set_to_none=True)
    out["loss_step"] = {
        "seconds": total,
        "forward_seconds": fwd,
        "backward_seconds": bwd,
        "peak_extra_bytes": peaks,
        "tokens_scored": args.batch * (PROMPT_LEN + args.completion - 1),
        "completion_tokens": args.batch * args.completion,
    }

    # ---- 2. whole train steps (generation included), the first one a warmup
    if args.train_repeats > 0:
        record: dict[str, list[float]] = {"seconds": [], "peak_extra_bytes": []}

        class Timer(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, _a: Any, state: Any, _c: Any, **_: Any) -> None:
                self.timed = state.global_step >= 1
                if self.timed:
                    gc.collect()
                    self.rss = reset_peak_rss()
                    self.t0 = time.perf_counter()

            def on_step_end(self, _a: Any, state: Any, _c: Any, **_: Any) -> None:
                if self.timed:
                    record["seconds"].append(time.perf_counter() - self.t0)
                    record["peak_extra_bytes"].append((proc_status_kib("VmHWM") - self.rss) * 1024)

        trainer.add_callback(Timer())
        trainer.train()
        logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
        record["completion_mean_length"] = [h["completions/mean_length"] for h in logs[1:]]
        out["train_step"] = record
    return out
