"""The toy task ("successor"): the default of ``gmpo train`` and of the TRL tests.

The prompt is a digit ``d`` followed by ``=``; the completion is correct when its first character
is the digit ``(d + 1) % 10``. A random policy over the vocabulary is right about 1 time in 20,
so the reward starts near 0.05; with :func:`toy_args` GMPO takes the mean of the last ten of 150
steps above 0.8 in seconds on a CPU (``tests/trl/test_training.py``). The model is a tiny
Qwen2-style one (:func:`gmpo_tasks.models.qwen2_model`) with random weights.
"""

from __future__ import annotations

import random
from typing import Any

from gmpo_tasks.chars import DIGITS, SEP, char_tokenizer
from gmpo_tasks.models import qwen2_model
from gmpo_tasks.task import Task


def successor_dataset(n: int = 256, *, seed: int = 0) -> Any:
    """``n`` prompts ``"d="`` with ``d`` uniform over the digits (a ``datasets.Dataset``)."""
    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_dict({"prompt": [f"{rng.choice(DIGITS)}{SEP}" for _ in range(n)]})


def successor_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1.0 when the completion starts with the successor of the prompt's digit, else 0.0."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        want = str((int(prompt[0]) + 1) % 10)
        out.append(1.0 if completion[:1] == want else 0.0)
    return out


def toy_args(output_dir: str, **overrides: Any) -> dict[str, Any]:
    """``GMPOConfig`` / ``GRPOConfig`` keyword arguments of the default toy run: CPU, float32
    (GRPOConfig defaults to bf16), no reporting, no checkpoints; 150 steps take seconds.

    With these defaults GMPO takes the successor task's mean reward from below 0.2 to above 0.8
    (means of the first and last ten steps; ``tests/trl/test_training.py`` asserts both)."""
    args: dict[str, Any] = dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        seed=0,
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=1,
        temperature=1.0,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        max_steps=150,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    args.update(overrides)
    return args


def model(seed: int, heads: int = 4) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a seed: the tiny Qwen2-style model (``heads`` attention heads)
    and the character tokenizer."""
    tokenizer = char_tokenizer()
    return qwen2_model(tokenizer, seed=seed, heads=heads), tokenizer


def run_args(output_dir: str) -> dict[str, Any]:
    """The built-in run's arguments: the toy's, with two optimizer steps per generation and two
    passes over each batch, so that updates are off-policy, the trust region acts and the
    log-ratio plot shows something (on-policy, r = 0)."""
    return toy_args(output_dir, num_iterations=2, steps_per_generation=2)


TASK = Task(
    name="successor",
    about="the toy run",
    dataset=lambda seed: successor_dataset(seed=seed),
    reward=successor_reward,
    model=model,
    trainer_args=run_args,
)
