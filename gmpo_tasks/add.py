"""A multi-token verifiable task whose answer is not a copy of the prompt: add two numbers.

The prompt is two numbers of ``L`` random digits each (leading zeros allowed), ``"a+b="``, each
written least significant digit first; the completion is correct when its first ``L + 1``
characters are the digits of ``a + b``, zero-padded to ``L + 1`` digits and written least
significant first too (so that the carry into each digit comes from digits already written).
Exact match gives reward 1.0, anything else 0.0. No answer token is a prompt token at a fixed
offset: each is a function of two prompt digits and the carry from the digits before it.

Its supervised warm start is every task's: noisy demonstrations (each target digit replaced,
with probability ``noise``, by a uniformly drawn digit). Its settings (4 digits, noise 0.15, a
1600-step warm start) come from the calibration rule of docs/study_plan.md on the calibration
seeds only (``python -m studies.stability.calibrate``; results/study-confirm/calibration.md).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gmpo_tasks.chars import DIGITS, PLUS, SEP
from gmpo_tasks.task import Task
from gmpo_tasks.warm_start import WarmStart

#: the calibrated setting (results/study-confirm/calibration.md): 4-digit numbers (a 5-digit
#: answer), 1600 supervised steps (the first count at which a clean warm start reached 0.9 on
#: every calibration seed) and noise 0.15 (mean warm-start reward 0.204, the closest to 0.22)
LENGTH = 4
NOISE = 0.15
WARM = WarmStart(steps=1600)


def target(prompt: str) -> str:
    """The right completion of ``"a+b="`` (``a`` and ``b`` least significant digit first): the
    ``len(a) + 1`` digits of the sum, least significant first."""
    a, b = prompt.rstrip(SEP).split(PLUS)
    return str(int(a[::-1]) + int(b[::-1])).zfill(len(a) + 1)[::-1]


def reward(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
    """Per completion: 1.0 when its first ``L + 1`` characters are the prompt's sum (least
    significant digit first), else 0.0. TRL's reward-function signature."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        want = target(prompt)
        out.append(1.0 if completion[: len(want)] == want else 0.0)
    return out


@dataclass(frozen=True)
class AddTask(Task):
    """Add two numbers of ``length`` digits, least significant digit first."""

    length: int = LENGTH
    noise: float = NOISE
    warm: WarmStart = field(default=WARM)

    name: ClassVar[str] = "add"
    about: ClassVar[str] = "add two 4-digit numbers (least significant digit first), exact match"
    quick_length: ClassVar[int] = 3

    @property
    def prompt_length(self) -> int:
        """Tokens of a prompt: two numbers, ``+`` and ``=``."""
        return 2 * self.length + 2

    @property
    def answer_length(self) -> int:
        """Tokens of the answer: the sum's ``L + 1`` digits."""
        return self.length + 1

    def prompts(self, n: int, *, seed: int | str) -> list[str]:
        """``n`` prompts ``"a+b="`` with uniform digits, the same for the same ``seed`` (uniform
        digits read in either order are uniform numbers)."""
        rng = random.Random(f"add-prompts:{self.length}:{seed}")
        out = []
        for _ in range(n):
            a, b = ("".join(rng.choices(DIGITS, k=self.length)) for _ in range(2))
            out.append(a + PLUS + b + SEP)
        return out

    def target(self, prompt: str) -> str:
        return target(prompt)

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **kw: Any) -> list[float]:
        """:func:`reward` (TRL's signature)."""
        return reward(prompts, completions, **kw)


TASK = AddTask()
