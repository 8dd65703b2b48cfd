"""The toy task ("successor"): the default of ``gmpo train`` and of the TRL tests.

The prompt is a digit ``d`` followed by ``=``; the completion is correct when its first character
is the digit ``(d + 1) % 10``. A random policy over the vocabulary is right about 1 time in 20,
so the reward starts near 0.05; with ``toy_args`` (``gmpo_tasks.task.toy_args``) GMPO takes the mean of the last ten of 150
steps above 0.8 in seconds on a CPU (``tests/trl/test_training.py``). The model is a tiny
Qwen2-style one (:func:`gmpo_tasks.models.qwen2_model`) with random weights: no warm start.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gmpo_tasks.chars import DIGITS, SEP
from gmpo_tasks.task import Task, toy_args


def successor_dataset(n: int = 256, *, seed: int = 0) -> Any:
    """``n`` prompts ``"d="`` with ``d`` uniform over the digits (a ``datasets.Dataset``)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": TASK.prompts(n, seed=seed)})


def successor_reward(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
    """1.0 when the completion starts with the successor of the prompt's digit, else 0.0."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        want = str((int(prompt[0]) + 1) % 10)
        out.append(1.0 if completion[:1] == want else 0.0)
    return out


@dataclass(frozen=True)
class SuccessorTask(Task):
    """The successor of one digit: a one-token answer, a random model, the toy run."""

    name: ClassVar[str] = "successor"
    about: ClassVar[str] = "the toy run"
    quick_length: ClassVar[int] = 1
    hidden_size: ClassVar[int] = 32
    vllm_heads: ClassVar[int] = 1

    @property
    def prompt_length(self) -> int:
        return 2

    @property
    def answer_length(self) -> int:
        return 1

    def prompts(self, n: int, *, seed: int | str) -> list[str]:
        """``n`` prompts ``"d="`` with ``d`` uniform over the digits."""
        rng = random.Random(seed)
        return [f"{rng.choice(DIGITS)}{SEP}" for _ in range(n)]

    def target(self, prompt: str) -> str:
        return str((int(prompt[0]) + 1) % 10)

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **kw: Any) -> list[float]:
        return successor_reward(prompts, completions, **kw)

    def lengths(self) -> tuple[int, int, int] | None:
        """None: the rotary model bounds no completion length."""
        return None

    def dataset(self, seed: int, n: int = 256) -> Any:
        return successor_dataset(n, seed=seed)

    def model(self, seed: int, heads: int | None = None) -> tuple[Any, Any]:
        """``(model, tokenizer)``: the tiny Qwen2-style model (``heads`` attention heads, 4 by
        default) with random weights, and the character tokenizer."""
        from gmpo_tasks.models import qwen2_model

        tokenizer = self.tokenizer()
        model = qwen2_model(tokenizer, seed=seed, heads=self.heads if heads is None else heads)
        return model, tokenizer

    def trainer_args(self, output_dir: str, **overrides: Any) -> dict[str, Any]:
        """The toy's arguments with two optimizer steps per generation and two passes over each
        batch, so that updates are off-policy, the trust region acts and the log-ratio plot
        shows something (on-policy, r = 0)."""
        return toy_args(output_dir, **{"num_iterations": 2, "steps_per_generation": 2, **overrides})

    def setting(self) -> str:
        return ""  # the toy run's setting is --help's closing paragraph


TASK = SuccessorTask()
