"""A multi-token verifiable task: reverse a string of L digits, built in-process and seeded.

The prompt is ``L`` random digits followed by ``=``; the completion is correct when its first
``L`` characters are the prompt's digits in reverse order (exact match, reward 1.0, else 0.0;
with ``partial_credit`` the reward is the fraction of the ``L`` positions that are right).
Unlike the toy's successor task (:mod:`gmpo_tasks.successor`), whose completion is a single token, a
completion here is ``L`` tokens, so the geometric and the arithmetic mean of a row's token
ratios differ: the setting in which GMPO and GRPO can behave differently.

The supervised warm start learns from *noisy* demonstrations: each target digit is replaced,
with probability ``noise``, by a uniformly drawn digit (which may be the right one). A policy
that matches that distribution gets a digit right with probability ``1 - noise + noise / 10``
and a whole string right with that number to the power ``L``: 0.91 ** 16 = 0.22 at the
defaults, a starting reward with room to move either way.

The prompts, reward and demonstrations are strings and the standard library, so they serve a
plain-torch model (``studies/stability``, with ``gmpo_tasks.chars.VOCAB`` and ``encode``) and TRL's
trainers (the reward has TRL's signature ``reward(prompts, completions, **kw)``). The setting of
a run (:data:`CELL`: prompts, completions, updates and rollouts, the learning rate) and the warm
start's (``gmpo_tasks.warm_start.WARM``) are written here once; the study and ``gmpo train
--task reverse`` read them. Nothing is imported from TRL; transformers, datasets and torch only
when a model or a dataset is built.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gmpo_tasks.chars import DIGITS, SEP, char_tokenizer
from gmpo_tasks.models import gpt2_model
from gmpo_tasks.task import Task
from gmpo_tasks.warm_start import (
    WARM,
    NoisyDemonstrations,
    WarmStart,
    sampled_reward,
    warm_start_hf,
)


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
class ReverseTask(NoisyDemonstrations):
    """The task's settings; each method is a pure function of its arguments and ``seed``.

    ``length``: digits per prompt (L). ``partial_credit``: reward the fraction of right positions
    instead of exact match. ``noise``: the probability that a demonstration's target digit is
    replaced by a uniformly drawn digit."""

    length: int = 16
    partial_credit: bool = False
    noise: float = 0.1

    demo_tag = "reverse"  # the demonstrations' random stream
    target = staticmethod(target)

    @property
    def prompt_length(self) -> int:
        """Tokens of a prompt: the digits and ``=``."""
        return self.length + 1

    @property
    def answer_length(self) -> int:
        """Tokens of the answer: the digits reversed."""
        return self.length

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


@dataclass(frozen=True)
class Cell:
    """The RL setting of docs/study.md: each of ``rollouts`` generations samples ``group``
    completions for each of ``prompts`` prompts at temperature 1 and takes ``minibatches`` Adam
    updates on each of ``epochs`` passes over it, at learning rate ``lr`` (where the study's
    methods separate most), without gradient clipping."""

    prompts: int = 16
    group: int = 8
    minibatches: int = 8
    epochs: int = 2
    rollouts: int = 100
    lr: float = 2e-3


CELL = Cell()


def reverse_model(
    task: ReverseTask, *, seed: int = 0, hidden_size: int = 64, heads: int = 4
) -> tuple[Any, Any]:
    """(tokenizer, model): the character tokenizer and the tiny GPT-2-style model
    (:func:`gmpo_tasks.models.gpt2_model`, ``heads`` heads) with room for a prompt of ``L + 1``
    and a completion of ``L`` tokens."""
    tokenizer = char_tokenizer()
    model = gpt2_model(
        tokenizer, 2 * task.length + 8, seed=seed, hidden_size=hidden_size, heads=heads
    )
    return tokenizer, model


#: the warm start of the built-in run's model (a test may set a shorter one)
WARM_START = WARM
_WARM_STATES: dict[tuple[ReverseTask, WarmStart, int, int], dict[str, Any]] = {}


def warm_model(
    task: ReverseTask, seed: int, *, settings: WarmStart | None = None, heads: int = 4
) -> tuple[Any, Any]:
    """(model, tokenizer): :func:`reverse_model` (``heads`` heads) after the warm start
    (``settings``, by default :data:`WARM_START`), both seeded by ``seed``. A warm start is
    computed once per task, setting, seed, heads and process (every method of a seed starts from
    the same model) and reported in one line."""
    settings = settings or WARM_START
    tokenizer, net = reverse_model(task, seed=seed, heads=heads)
    key = (task, settings, seed, heads)
    if key not in _WARM_STATES:
        losses = warm_start_hf(net, tokenizer, task, seed=seed, settings=settings)
        start = sampled_reward(net, tokenizer, task, seed=seed)
        print(f"warm start (seed {seed}): {settings.steps} supervised steps, loss "
              f"{losses[0]:.2f} -> {losses[-1]:.2f}, sampled reward {start:.3f}")  # fmt: skip
        _WARM_STATES[key] = {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(_WARM_STATES[key])
    return net, tokenizer


def reverse_dataset(task: ReverseTask, n: int = 2048, *, seed: int = 0) -> Any:
    """``n`` prompts of the task as a ``datasets.Dataset`` with a ``prompt`` column."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": task.prompts(n, seed=f"train:{seed}")})


def reverse_args(
    output_dir: str, task: ReverseTask, *, rollouts: int = CELL.rollouts, **overrides: Any
) -> dict[str, Any]:
    """``GMPOConfig`` / ``GRPOConfig`` keyword arguments of :data:`CELL`: ``rollouts``
    generations of ``prompts x group`` completions, ``minibatches x epochs`` optimizer steps on
    each (``steps_per_generation`` slices, ``num_iterations`` passes), no gradient clipping
    (``max_grad_norm=0``). Give GRPOConfig ``loss_type="grpo"`` for the study's ``grpo``."""
    from gmpo_tasks.successor import toy_args

    steps_per_generation, num_iterations = CELL.minibatches, CELL.epochs
    args = toy_args(
        output_dir,
        per_device_train_batch_size=CELL.prompts * CELL.group // CELL.minibatches,
        steps_per_generation=steps_per_generation,
        num_iterations=num_iterations,
        num_generations=CELL.group,
        max_completion_length=task.length,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        learning_rate=CELL.lr,
        max_grad_norm=0.0,
        max_steps=rollouts * steps_per_generation * num_iterations,
        logging_steps=steps_per_generation * num_iterations,
    )
    args.update(overrides)
    return args


_TASK = ReverseTask()


def _lengths() -> tuple[int, int, int]:
    """(prompt tokens, positions, answer tokens) of the built-in run's model (built untrained:
    its config's positions)."""
    tokenizer, model = reverse_model(_TASK)
    prompt = len(tokenizer(_TASK.prompts(1, seed=0)[0])["input_ids"])
    return prompt, model.config.n_positions, _TASK.length


TASK = Task(
    name="reverse",
    about="reverse 16 digits, exact match; a tiny GPT-2-style model warm-started on noisy "
    "demonstrations; without --model, the setting of docs/study.md instead of the toy values: "
    f"{CELL.rollouts} generations of {CELL.prompts} prompts x {CELL.group} completions, "
    f"{CELL.minibatches * CELL.epochs} optimizer steps on each (steps_per_generation="
    f"{CELL.minibatches}, num_iterations={CELL.epochs}), learning_rate={CELL.lr:g}, "
    "max_grad_norm=0",
    dataset=lambda seed: reverse_dataset(_TASK, seed=seed),
    reward=_TASK.reward_function(),
    model=lambda seed, heads=4: warm_model(_TASK, seed, heads=heads),
    trainer_args=lambda output_dir: reverse_args(output_dir, _TASK),
    lengths=_lengths,
)
