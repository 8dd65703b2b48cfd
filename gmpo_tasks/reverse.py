"""A multi-token verifiable task: reverse a string of L digits, built in-process and seeded.

The prompt is ``L`` random digits followed by ``=``; the completion is correct when its first
``L`` characters are the prompt's digits in reverse order (exact match, reward 1.0, else 0.0;
with ``partial_credit`` the reward is the fraction of the ``L`` positions that are right).
Unlike the toy's successor task (:mod:`gmpo_trl.toy`), whose completion is a single token, a
completion here is ``L`` tokens, so the geometric and the arithmetic mean of a row's token
ratios differ: the setting in which GMPO and GRPO can behave differently.

The supervised warm start learns from *noisy* demonstrations: each target digit is replaced,
with probability ``noise``, by a uniformly drawn digit (which may be the right one). A policy
that matches that distribution gets a digit right with probability ``1 - noise + noise / 10``
and a whole string right with that number to the power ``L``: 0.91 ** 16 = 0.22 at the
defaults, a starting reward with room to move either way.

Everything is strings and the standard library, so the same prompts, reward and demonstrations
serve a plain-torch model (``benchmarks/stability.py``, with :data:`VOCAB` and :func:`encode`)
and TRL's trainers (the reward has TRL's signature ``reward(prompts, completions, **kw)``).
This module imports neither TRL nor transformers (nor torch).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

DIGITS = "0123456789"
SEP = "="
#: the study's 16 symbols: the digits, the separator and five distractors (never right in a
#: completion); the toy's character tokenizer (:func:`gmpo_trl.toy.char_tokenizer`) has them all
VOCAB = DIGITS + SEP + "abcde"
_INDEX = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Token ids of ``text`` in :data:`VOCAB` (one character, one token)."""
    try:
        return [_INDEX[c] for c in text]
    except KeyError as err:
        raise ValueError(f"encode: {err.args[0]!r} is not in the vocabulary {VOCAB!r}") from err


def decode(ids: Sequence[int]) -> str:
    """The string of token ids in :data:`VOCAB`."""
    return "".join(VOCAB[i] for i in ids)


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
class ReverseTask:
    """The task's settings; each method is a pure function of its arguments and ``seed``.

    ``length``: digits per prompt (L). ``partial_credit``: reward the fraction of right positions
    instead of exact match. ``noise``: the probability that a demonstration's target digit is
    replaced by a uniformly drawn digit."""

    length: int = 16
    partial_credit: bool = False
    noise: float = 0.1

    def __post_init__(self) -> None:
        if not (isinstance(self.length, int) and self.length >= 1):
            raise ValueError(f"length must be an integer >= 1, got {self.length!r}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {self.noise!r}")

    def prompts(self, n: int, *, seed: int | str) -> list[str]:
        """``n`` prompts ``"d1...dL="`` with uniform digits, the same for the same ``seed``."""
        rng = random.Random(f"reverse-prompts:{self.length}:{seed}")
        return ["".join(rng.choices(DIGITS, k=self.length)) + SEP for _ in range(n)]

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **kw: Any) -> list[float]:
        """:func:`reward` with this task's ``partial_credit`` (TRL's signature)."""
        return reward(prompts, completions, partial_credit=self.partial_credit, **kw)

    def reward_function(self) -> Callable[..., list[float]]:
        """The module-level reward function of this task's setting, for TRL's ``reward_funcs``."""
        return partial_reward if self.partial_credit else reward

    def demonstrations(self, n: int, *, seed: int | str) -> list[tuple[str, str]]:
        """``n`` (prompt, noisy completion) pairs for the supervised warm start: each target digit
        replaced with probability ``noise`` by a uniform digit. The same for the same ``seed``."""
        rng = random.Random(f"reverse-demos:{self.length}:{self.noise}:{seed}")
        out = []
        for prompt in self.prompts(n, seed=f"demo:{seed}"):
            noisy = [rng.choice(DIGITS) if rng.random() < self.noise else c for c in target(prompt)]
            out.append((prompt, "".join(noisy)))
        return out

    def expected_warm_reward(self) -> float:
        """Exact-match reward of a policy that matches the demonstrations' distribution."""
        return (1.0 - self.noise + self.noise / len(DIGITS)) ** self.length
