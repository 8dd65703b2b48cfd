"""A multi-token verifiable task: reverse a string of L digits, built in-process and seeded.

The prompt is ``L`` random digits followed by ``=``; the completion is correct when its first
``L`` characters are the prompt's digits in reverse order (exact match, reward 1.0, else 0.0;
with ``partial_credit`` the reward is the fraction of the ``L`` positions that are right).
Unlike the toy's successor task (:mod:`gmpo_tasks.successor`), whose completion is a single
token, a completion here is ``L`` tokens, so the geometric and the arithmetic mean of a row's
token ratios differ: the setting in which GMPO and GRPO can behave differently.

The supervised warm start learns from *noisy* demonstrations: each target digit is replaced,
with probability ``noise``, by a uniformly drawn digit (which may be the right one). A policy
that matches that distribution gets a digit right with probability ``1 - noise + noise / 10``
and a whole string right with that number to the power ``L``: 0.91 ** 16 = 0.22 at the
defaults, a starting reward with room to move either way.

The built-in model is a tiny GPT-2-style one (learned absolute positions: reversing needs the
output at position ``L + 1 + i`` to find the prompt's position ``L - 1 - i``, which a rotary
model of this size did not learn). The run's setting is ``gmpo_tasks.task.CELL``, docs/study.md's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gmpo_tasks.chars import DIGITS, SEP
from gmpo_tasks.task import Backward, Task
from gmpo_tasks.warm_start import WARM, WarmStart


def target(prompt: str) -> str:
    """The right completion of a prompt ``"d1...dL="``: ``"dL...d1"``."""
    digits = prompt[:-1] if prompt.endswith(SEP) else prompt
    return digits[::-1]


def reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    partial_credit: bool = False,
    **_: Any,
) -> list[float]:
    """Per completion: 1.0 when its first ``L`` characters reverse the prompt's ``L`` digits,
    else 0.0; with ``partial_credit``, the fraction of those ``L`` positions that are right.

    TRL's reward-function signature (``**_`` takes the extra columns TRL passes). Characters
    after the first ``L`` are ignored (an end-of-sequence marker, say)."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        want = target(prompt)
        got = completion[: len(want)]
        if partial_credit:
            right = sum(a == b for a, b in zip(want, got, strict=False))
            out.append(right / max(len(want), 1))
        else:
            out.append(1.0 if got == want else 0.0)
    return out


def partial_reward(prompts: Sequence[str], completions: Sequence[str], **kw: Any) -> list[float]:
    """:func:`reward` with partial credit (a named function, as TRL logs rewards by name)."""
    return reward(prompts, completions, partial_credit=True, **kw)


@dataclass(frozen=True)
class ReverseTask(Backward, Task):
    """Reverse ``length`` digits. ``partial_credit``: reward the fraction of right positions
    instead of exact match."""

    length: int = 16
    noise: float = 0.1
    warm: WarmStart = field(default=WARM)
    partial_credit: bool = False

    name: ClassVar[str] = "reverse"
    about: ClassVar[str] = "reverse 16 digits, exact match"
    quick_length: ClassVar[int] = 6

    def prompts(self, n: int, *, seed: int | str) -> list[str]:
        """``n`` prompts ``"d1...dL="`` with uniform digits, the same for the same ``seed``."""
        rng = random.Random(f"reverse-prompts:{self.length}:{seed}")
        return ["".join(rng.choices(DIGITS, k=self.length)) + SEP for _ in range(n)]

    def target(self, prompt: str) -> str:
        return target(prompt)

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **kw: Any) -> list[float]:
        """:func:`reward` with this task's ``partial_credit`` (TRL's signature)."""
        return reward(prompts, completions, partial_credit=self.partial_credit, **kw)

    def reward_function(self) -> Callable[..., list[float]]:
        """The module-level reward function of this task's setting, for TRL's ``reward_funcs``
        (TRL logs a reward under its function's name)."""
        return partial_reward if self.partial_credit else reward


TASK = ReverseTask()
