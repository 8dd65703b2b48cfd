"""Shared builders for the vLLM tests: a tiny model vLLM's CPU attention can run, saved where vLLM
loads it from, and GMPOTrainers that generate with vLLM (TRL's colocate mode) on the CPU.

Everything is built in the test session (no hub, no network). Importing this module skips the
importing test module where vLLM is not installed (the main environment: ``make vllm`` builds
the one that runs these tests).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM sizes it from RAM without it
pytest.importorskip(
    "vllm", reason="vLLM is not installed (make vllm builds the environment these tests run in)"
)

import torch

from gmpo_tasks import successor as toy
from gmpo_tasks.chars import char_tokenizer
from gmpo_tasks.models import qwen2_model
from gmpo_trl import GMPOConfig, GMPOTrainer

TOKENIZER = char_tokenizer()
#: the toy's model with one head of 32 (head_dim 32: the smallest vLLM's CPU attention takes)
HEADS = 1
#: completions of up to 3 tokens (the reward reads the first): the token modes' (B, T) weights
#: then differ from the sequence modes' (B, 1) ones
COMPLETION = 3


def vllm_model(tmp: Path, *, seed: int = 0) -> Any:
    """The toy's tiny Qwen2 (hidden 32, one head), saved to ``tmp/init`` with its tokenizer, its
    ``name_or_path`` pointing there (TRL builds vLLM's engine from it)."""
    model = qwen2_model(TOKENIZER, seed=seed, heads=HEADS)
    path = Path(tmp) / "init"
    model.save_pretrained(path)
    TOKENIZER.save_pretrained(path)
    model.config._name_or_path = model.name_or_path = str(path)
    return model


def vllm_args(tmp: Path, **overrides: Any) -> dict[str, Any]:
    """The toy run's arguments with vLLM generation (colocate, on the CPU)."""
    base: dict[str, Any] = dict(
        gmpo_impl="plain",
        use_vllm=True,
        vllm_mode="colocate",
        max_completion_length=COMPLETION,
        per_device_train_batch_size=32,
    )
    return toy.toy_args(str(tmp), **{**base, **overrides})


def vllm_trainer(tmp: Path, *, seed: int = 0, model: Any = None, **overrides: Any) -> Any:
    """A GMPOTrainer generating with vLLM on the CPU, on a fresh tiny model (``seed``)."""
    args = GMPOConfig(**vllm_args(tmp, seed=seed, **overrides))
    return GMPOTrainer(
        model=model if model is not None else vllm_model(tmp, seed=seed),
        reward_funcs=toy.successor_reward,
        args=args,
        train_dataset=toy.successor_dataset(seed=seed),
        processing_class=TOKENIZER,
    )


class Recorder:
    """Wraps a trainer's ``_generate_and_score_completions``: keeps, for every generation, the
    trainer's log-probs of the sampled tokens (``old_per_token_logps``), vLLM's
    (``sampling_per_token_logps``), the completion mask and the optimizer step."""

    def __init__(self, trainer: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        inner = trainer._generate_and_score_completions

        def wrapped(inputs: Any) -> Any:
            out = inner(inputs)
            self.rows.append(
                {
                    "step": trainer.state.global_step,
                    "trainer": out["old_per_token_logps"].detach().clone(),
                    "vllm": out["sampling_per_token_logps"].detach().clone(),
                    "mask": out["completion_mask"].bool().clone(),
                }
            )
            return out

        trainer._generate_and_score_completions = wrapped


def sync_gaps(rows: list[dict[str, Any]]) -> list[float]:
    """Per generation: the largest |trainer log-prob - vLLM log-prob| over the sampled tokens."""
    return [float((r["trainer"] - r["vllm"]).abs()[r["mask"]].max()) for r in rows]


def assert_synced(rows: list[dict[str, Any]], tol: float) -> None:
    """At every generation, vLLM's log-probs of the sampled tokens equal the trainer's to tol."""
    assert rows, "no generation was recorded"
    gaps = sync_gaps(rows)
    bad = [(r["step"], round(g, 4)) for r, g in zip(rows, gaps, strict=True) if not g <= tol]
    assert not bad, f"vLLM's log-probs differ from the trainer's by more than {tol}: {bad[:5]}"


def rewards(trainer: Any) -> list[float]:
    """The mean reward of every logged step."""
    return [row["reward"] for row in trainer.state.log_history if "reward" in row]


def batch(trainer: Any, seed: int = 0) -> list[dict[str, Any]]:
    """One generation's prompts, as the trainer's dataloader gives them (each prompt repeated
    num_generations times)."""
    g = torch.Generator().manual_seed(seed)
    n = trainer.args.per_device_train_batch_size // trainer.num_generations
    digits = torch.randint(0, 10, (n,), generator=g).tolist()
    return [{"prompt": f"{d}="} for d in digits for _ in range(trainer.num_generations)]
