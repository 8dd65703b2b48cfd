"""The supervised warm start: the one loop and its settings, for any model.

A task with a warm start (``gmpo_tasks.reverse``) provides noisy demonstrations
(``task.demonstrations(n, seed=...)``: (prompt, completion) pairs); :func:`warm_start` takes
:data:`WARM`'s Adam steps on fresh ones, with the loss a model computes on a batch of them
(``batch_loss``: the mean negative log-likelihood of the completion tokens). The plain-torch
study (``studies/stability``) and TRL's trainers (:func:`warm_start_hf`, a transformers causal
LM with a character tokenizer) share it, and its settings.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gmpo_tasks.chars import DIGITS


class Demonstrating(Protocol):
    """A task with demonstrations (``gmpo_tasks.reverse.ReverseTask``)."""

    length: int

    def demonstrations(self, n: int, *, seed: int | str) -> list[tuple[str, str]]: ...

    def prompts(self, n: int, *, seed: int | str) -> list[str]: ...

    def reward(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]: ...


def noisy_demonstrations(
    prompts: Iterable[str], target: Callable[[str], str], noise: float, rng: random.Random
) -> list[tuple[str, str]]:
    """(prompt, completion) pairs: each digit of ``target(prompt)`` replaced, with probability
    ``noise``, by a uniformly drawn digit (which may be the right one), drawn from ``rng``."""
    out = []
    for prompt in prompts:
        noisy = [rng.choice(DIGITS) if rng.random() < noise else c for c in target(prompt)]
        out.append((prompt, "".join(noisy)))
    return out


def imitation_reward(noise: float, tokens: int) -> float:
    """Exact-match reward of a policy that matches such demonstrations, ``tokens`` digits long:
    each digit right with probability ``1 - noise + noise / 10``."""
    return (1.0 - noise + noise / len(DIGITS)) ** tokens


class NoisyDemonstrations:
    """A task's noisy demonstrations (and its settings' checks), for a dataclass with ``length``, ``noise``,
    ``answer_length``, ``prompts(n, seed=...)``, ``target(prompt)`` and ``demo_tag`` (its
    demonstrations' random stream)."""

    length: int
    noise: float
    demo_tag: str
    target: Callable[[str], str]

    answer_length: int
    prompts: Callable[..., list[str]]

    def __post_init__(self) -> None:  # the dataclass's checks of its settings
        if not (isinstance(self.length, int) and self.length >= 1):
            raise ValueError(f"length must be an integer >= 1, got {self.length!r}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {self.noise!r}")

    def demonstrations(self, n: int, *, seed: int | str) -> list[tuple[str, str]]:
        """``n`` (prompt, noisy completion) pairs for the supervised warm start: each target digit
        replaced with probability ``noise`` by a uniform digit. The same for the same ``seed``."""
        rng = random.Random(f"{self.demo_tag}-demos:{self.length}:{self.noise}:{seed}")
        prompts = self.prompts(n, seed=f"demo:{seed}")
        return noisy_demonstrations(prompts, self.target, self.noise, rng)

    def expected_warm_reward(self) -> float:
        """Exact-match reward of a policy that matches the demonstrations' distribution."""
        return imitation_reward(self.noise, self.answer_length)


@dataclass(frozen=True)
class WarmStart:
    """``steps`` Adam steps at learning rate ``lr`` on ``batch`` fresh demonstrations each."""

    steps: int = 400
    batch: int = 64
    lr: float = 3e-3


#: the warm start of docs/study.md (the study and ``gmpo train --task reverse``)
WARM = WarmStart()


def warm_start(
    params: Iterable[Any],
    batch_loss: Callable[[list[tuple[str, str]]], Any],
    task: Demonstrating,
    seed: int,
    settings: WarmStart = WARM,
) -> list[float]:
    """Train ``params`` in place: ``settings.steps`` Adam steps, each on the loss of
    ``settings.batch`` fresh demonstrations (those of ``(seed, step)``); the losses."""
    import torch

    torch.manual_seed(seed)
    opt = torch.optim.Adam(params, lr=settings.lr)
    losses = []
    for step in range(settings.steps):
        loss = batch_loss(task.demonstrations(settings.batch, seed=f"{seed}:{step}"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _ids(tokenizer: Any, texts: list[str]) -> Any:
    return tokenizer(texts, return_tensors="pt", add_special_tokens=False)["input_ids"]


def warm_start_hf(
    model: Any, tokenizer: Any, task: Demonstrating, *, seed: int = 0, settings: WarmStart = WARM
) -> list[float]:
    """:func:`warm_start` of a transformers causal LM (the loss on the completion tokens only)."""
    model.train()

    def batch_loss(demos: list[tuple[str, str]]) -> Any:
        ids = _ids(tokenizer, [p + c for p, c in demos])  # (batch, 2L + 1): no padding
        labels = ids.clone()
        labels[:, : task.length + 1] = -100  # the prompt and '=' are not learned
        return model(input_ids=ids, labels=labels).loss

    return warm_start(model.parameters(), batch_loss, task, seed, settings)


def sampled_reward(model: Any, tokenizer: Any, task: Demonstrating, *, n: int = 256,
                   seed: int = 0) -> float:  # fmt: skip
    """Mean reward of ``n`` completions of a transformers model, sampled at temperature 1 on
    held-out prompts."""
    import torch

    prompts = task.prompts(n, seed=f"eval:{seed}")
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            _ids(tokenizer, prompts),
            attention_mask=None,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=task.length,
            min_new_tokens=task.length,
        )
    completions = tokenizer.batch_decode(out[:, task.length + 1 :], skip_special_tokens=True)
    return sum(task.reward(prompts, completions)) / n
