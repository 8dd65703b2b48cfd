"""One training step of GRPO-family trainers on the same batch and weights: gmpo_trl's
GMPOTrainer with each LM head (its default: gmpo_core's fused Triton head on a GPU with Triton;
gmpo_core's torch backend; TRL's head, ``gmpo_lm_head=False``), TRL's GRPOTrainer and TRL's
``trl.experimental.gmpo.GMPOTrainer``; seconds per step and peak memory (scripts/gpu.sh).

Run from the repository root, where trl is installed::

    python benchmarks/bench_gpu_step.py --device cuda     # Qwen3-0.6B's shape, bf16
    python benchmarks/bench_gpu_step.py --quick           # a tiny Qwen3 on the CPU (the dry run)

The model is a ``Qwen3ForCausalLM`` built from a ``Qwen3Config`` of Qwen3-0.6B's shape (hidden
1024, 28 layers, 16 heads, 8 key/value heads, head dim 128, MLP 3072, vocabulary 151,936, tied
embeddings), random weights (seed 0, no hub), in bf16 on CUDA. The tokenizer is the toy
character tokenizer padded with dummy tokens up to V. A step is ``trainer.compute_loss`` on one
fixed batch (B rows of prompt and completion tokens, behaviour log-probs near the random
model's, so the clip acts), its backward and one optimizer step (the trainer's AdamW); the
generation is not part of it. Each trainer gets a fresh copy of the model; the warm-up steps are
untimed; time: between ``torch.cuda.synchronize()`` calls, the median of the timed steps; peak:
``torch.cuda.max_memory_allocated()`` over the memory allocated before the step (gradients and
the optimizer's state included once created in the warm-up). On the CPU (the dry run) the peak
is not measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from _common import RESULTS, dist_version, run_meta
from _trainer_step_child import PROMPT_LEN, hash_reward

RESULTS_DIR = RESULTS / "figures-lm-head"
TRAINERS = ("gmpo_trl GMPOTrainer", "gmpo_trl GMPOTrainer, gmpo_lm_head=True", "TRL GRPOTrainer",
            "TRL experimental GMPOTrainer", "gmpo_trl GMPOTrainer, torch backend",
            "gmpo_trl GMPOTrainer, gmpo_lm_head=False")  # fmt: skip
#: gmpo_trl's trainers: name -> (GMPOConfig.gmpo_lm_head, GMPOTrainer.gmpo_lm_head_backend)
GMPO_HEADS = {TRAINERS[0]: (None, None), TRAINERS[1]: (True, None), TRAINERS[4]: (True, "torch"),
              TRAINERS[5]: (False, None)}  # fmt: skip
QWEN3_06B = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
             "vocab_size": 151_936}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000}  # fmt: skip


def _model(shape: dict[str, int], dtype: Any, device: str, max_len: int) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**shape, tie_word_embeddings=True, max_position_embeddings=max_len)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(device=device, dtype=dtype)


def _trainer(name: str, model: Any, tokenizer: Any, out: str, args: argparse.Namespace) -> Any:
    from gmpo_tasks import successor as toy

    kwargs = toy.toy_args(out, per_device_train_batch_size=args.batch, num_generations=args.batch,
                          max_completion_length=args.completion, max_steps=1)  # fmt: skip
    kwargs.update(bf16=args.device != "cpu", use_cpu=args.device == "cpu")
    if name in GMPO_HEADS:
        from gmpo_trl import GMPOConfig, GMPOTrainer

        setting, backend = GMPO_HEADS[name]
        kwargs.update(gmpo_lm_head_backward=args.backward, gmpo_lm_head=setting)
        trainer = GMPOTrainer(model=model, reward_funcs=hash_reward, args=GMPOConfig(**kwargs),
                              train_dataset=toy.successor_dataset(), processing_class=tokenizer)  # fmt: skip
        trainer.gmpo_lm_head_backend = backend
        return trainer
    if name == TRAINERS[2]:
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl.experimental.gmpo import GMPOConfig as Config
        from trl.experimental.gmpo import GMPOTrainer as Trainer
    return Trainer(model=model, reward_funcs=hash_reward, args=Config(**kwargs),
                   train_dataset=toy.successor_dataset(), processing_class=tokenizer)  # fmt: skip


def _batch(args: argparse.Namespace, vocab: int, device: str) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    b, t = args.batch, args.completion
    prompt = torch.randint(2, vocab, (b, PROMPT_LEN), generator=g)
    completion = torch.randint(2, vocab, (b, t), generator=g)
    batch = {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion, "completion_mask": torch.ones_like(completion),
        "advantages": torch.randn(b, generator=g),
        "old_per_token_logps": -math.log(vocab) + 0.2 * torch.randn(b, t, generator=g),
    }  # fmt: skip
    batch["num_items_in_batch"] = batch["completion_mask"].sum()  # GRPOTrainer's DAPO normalizer
    return {k: v.to(device) for k, v in batch.items()}


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from gmpo_tasks.chars import char_tokenizer

    shape = TINY if args.quick else QWEN3_06B
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    tokenizer = char_tokenizer(vocab_size=shape["vocab_size"])
    model = _model(shape, dtype, args.device, PROMPT_LEN + args.completion)
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(name, model, tokenizer, out, args)
        optimizer = trainer.create_optimizer()
        batch = _batch(args, shape["vocab_size"], args.device)
        model.train()
        trainer.current_gradient_accumulation_steps = 1
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        seconds, peaks, losses = [], [], []
        for step in range(args.warmup + args.repeats):
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            loss = trainer.compute_loss(model, dict(batch))
            trainer.accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            if step >= args.warmup:
                seconds.append(time.perf_counter() - t0)
                losses.append(float(loss.detach()))
                if cuda:
                    peaks.append(torch.cuda.max_memory_allocated() - base)
        del trainer, optimizer, model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return {"seconds": seconds, "peak_extra_bytes": peaks, "losses": losses}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny Qwen3, 2 steps; nothing written")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=8, help="rows (one prompt's generations)")
    p.add_argument("--completion", type=int, default=510, help="completion tokens per row")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backward", default="half", help="GMPOConfig.gmpo_lm_head_backward")
    p.add_argument("--trainers", default=";".join(TRAINERS), help="separated by ;")
    p.add_argument("--tag", default="cuda")
    args = p.parse_args(argv)
    if dist_version("trl") is None:
        print("trl is not installed: pip install --no-deps trl==1.16.0 (and accelerate, datasets)")
        return 2
    if args.quick:
        args.batch, args.completion, args.warmup, args.repeats = 2, 6, 1, 1
    import torch

    rows: dict[str, Any] = {}
    for name in args.trainers.split(";"):
        rows[name] = run(name, args)
        r = rows[name]
        peak = (
            f", peak extra {max(r['peak_extra_bytes']) / 1e9:.2f} GB"
            if r["peak_extra_bytes"]
            else ""
        )
        print(f"{name}: {statistics.median(r['seconds']):.4f} s/step{peak}, "
              f"loss {r['losses'][0]:.6f}", flush=True)  # fmt: skip
    model = "a tiny Qwen3, float32" if args.quick else "Qwen3-0.6B's shape, bf16"
    meta = {**run_meta(__file__, argv, dist_version("trl")), "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
            "batch": args.batch, "completion": args.completion, "backward": args.backward}  # fmt: skip
    lines = [f"# One training step, GRPO-family trainers ({meta['date_utc']})", "",
             f"Command: `{meta['command']}`  ", f"torch {meta['torch']}, trl {meta['trl']}, "
             f"device {args.device} ({meta['gpu']}); {model}, B {args.batch}, "
             f"completion {args.completion} tokens.", "",
             "| trainer | s/step (median) | peak extra GB | loss |", "|---|---:|---:|---:|"]  # fmt: skip
    for name, r in rows.items():
        peak = f"{max(r['peak_extra_bytes']) / 1e9:.2f}" if r["peak_extra_bytes"] else "—"
        lines.append(f"| {name} | {statistics.median(r['seconds']):.4f} | {peak} "
                     f"| {r['losses'][0]:.6f} |")  # fmt: skip
    print("\n".join(lines))
    if not args.quick:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stem = RESULTS_DIR / f"gpu_step_{args.tag}"
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print(f"wrote {stem}.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
