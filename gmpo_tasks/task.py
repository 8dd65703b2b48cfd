"""What a task is: one type for ``gmpo --task``, the stability study and the tests.

A task module defines a frozen dataclass subclass of :class:`Task` and an instance of it named
``TASK`` with the task's own settings; ``gmpo_tasks.catalog.TASKS`` lists them (one line per
task). A subclass gives the task's strings: its prompts, the right answer of a prompt and the
reward of completions (TRL's reward-function signature), in its alphabet. The rest is derived
here, the same for every task:

- the supervised warm start's noisy demonstrations (each answer character replaced, with
  probability ``noise``, by a uniformly drawn one of ``answer_chars``);
- what the study needs (:attr:`Task.quick_length`, the length of its ``--quick`` smoke run;
  :meth:`Task.sources`, the files its cache fingerprint reads; the vocabulary and lengths of
  its plain-torch model);
- what a run through TRL needs (:meth:`Task.dataset`, :meth:`Task.model` warm-started,
  :meth:`Task.trainer_args`; :attr:`Task.vllm_heads`, the heads of its built-in model under
  ``--use_vllm``; :meth:`Task.lengths` for the completion-length check).

Answers of one fixed length (``variable_length = False``) are exactly ``answer_length`` tokens;
otherwise an answer ends with the end-of-sequence token, at most ``answer_length`` characters
before it. Strings and the standard library only at import: torch, transformers and datasets
are imported when a model or a dataset is built.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gmpo_tasks.chars import CHARS, DIGITS, VOCAB
from gmpo_tasks.warm_start import WarmStart, imitation_reward


@dataclass(frozen=True)
class Cell:
    """The RL setting of a task's built-in run (and of the study's runs): each of ``rollouts``
    generations samples ``group`` completions for each of ``prompts`` prompts at temperature 1
    and takes ``minibatches`` Adam updates on each of ``epochs`` passes over it, at learning
    rate ``lr``, without gradient clipping."""

    prompts: int = 16
    group: int = 8
    minibatches: int = 8
    epochs: int = 2
    rollouts: int = 100
    lr: float = 2e-3


#: docs/study.md's setting (the reverse task's, and the default of every task with a warm start)
CELL = Cell()


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


@dataclass(frozen=True)
class Task:
    """A built-in task. ``length``: its size (digits to reverse, digits per number, terms...).
    ``noise``: the probability that a demonstration's answer character is replaced by a
    uniformly drawn one. ``warm``: the supervised warm start (0 steps: none). Subclasses set the
    class attributes below and implement :meth:`prompts`, :meth:`target`, :meth:`reward` and the
    two lengths."""

    length: int = 1
    noise: float = 0.0
    warm: WarmStart = field(default_factory=lambda: WarmStart(steps=0))

    #: what ``--task`` takes, and one sentence for ``--help``
    name: ClassVar[str] = ""
    about: ClassVar[str] = ""
    #: the characters of the built-in model's tokenizer, in token-id order
    alphabet: ClassVar[str] = CHARS
    #: the plain-torch study's vocabulary (plus the end-of-sequence token where answers vary in
    #: length): every character of a prompt or an answer. The digit tasks keep the 16 symbols
    #: the first study's models were built with
    symbols: ClassVar[str] = VOCAB
    #: the characters a demonstration's noise draws from
    answer_chars: ClassVar[str] = DIGITS
    #: answers end with the end-of-sequence token (at most ``answer_length`` characters before)
    variable_length: ClassVar[bool] = False
    #: the study's ``--quick`` smoke run: this ``length``
    quick_length: ClassVar[int] = 1
    #: the built-in model: width and heads, and heads under ``--use_vllm`` (vLLM's CPU attention
    #: takes a head_dim of 32 or more)
    hidden_size: ClassVar[int] = 64
    heads: ClassVar[int] = 4
    vllm_heads: ClassVar[int] = 2
    #: the built-in run's setting through TRL
    cell: ClassVar[Cell] = CELL
    #: the package this task's code needs beyond torch, None for none, and the extra of gmpo
    #: that installs it
    requires: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None
    #: the pretrained model (a name of ``gmpo_tasks.pretrained.MODELS``) a run of this task
    #: trains unless ``--model`` names another; None: the task's built-in tiny model
    model_name: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length must be an integer >= 1, got {self.length!r}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {self.noise!r}")

    # --- what a task module gives -------------------------------------------------------------

    @property
    def prompt_length(self) -> int:
        """Tokens of every prompt (a task's prompts have one length)."""
        raise NotImplementedError

    @property
    def answer_length(self) -> int:
        """Tokens of an answer: exactly, or at most where answers vary (the end-of-sequence
        token not counted)."""
        raise NotImplementedError

    def prompts(self, n: int, *, seed: int | str) -> list[str]:
        """``n`` prompts, the same for the same ``seed``."""
        raise NotImplementedError

    def target(self, prompt: str) -> str:
        """A right answer of ``prompt`` (the demonstrations' answer)."""
        raise NotImplementedError

    def reward(self, prompts: Sequence[str], completions: Sequence[str], **kw: Any) -> list[float]:
        """Per completion, its reward (TRL's reward-function signature)."""
        raise NotImplementedError

    # --- derived: the warm start's demonstrations ----------------------------------------------

    @property
    def completion_length(self) -> int:
        """Tokens a completion is sampled to: the answer, and the end-of-sequence token where
        answers vary in length."""
        return self.answer_length + int(self.variable_length)

    def demonstrations(self, n: int, *, seed: int | str) -> list[tuple[str, str]]:
        """``n`` (prompt, noisy answer) pairs for the supervised warm start: each character of
        the answer replaced with probability ``noise`` by a uniform one of ``answer_chars``.
        The same for the same ``seed``."""
        rng = random.Random(f"{self.name}-demos:{self.length}:{self.noise}:{seed}")
        out = []
        for prompt in self.prompts(n, seed=f"demo:{seed}"):
            answer = self.target(prompt)
            noisy = [rng.choice(self.answer_chars) if rng.random() < self.noise else c
                     for c in answer]  # fmt: skip
            out.append((prompt, "".join(noisy)))
        return out

    def expected_warm_reward(self) -> float:
        """Exact-match reward of a policy that matches the demonstrations of a fixed-length
        answer (each character right with probability ``1 - noise + noise / |answer_chars|``)."""
        return imitation_reward(self.noise, self.answer_length, len(self.answer_chars))

    # --- derived: the study and its cache ------------------------------------------------------

    def sources(self) -> list[Path]:
        """The files whose content a run of this task depends on besides the study's own code
        (the cache keys read them): the module of every class in the task's type hierarchy
        within gmpo_tasks, and the modules they share."""
        here = Path(__file__).parent
        files = {here / "chars.py", here / "warm_start.py", here / "task.py", here / "models.py"}
        for cls in type(self).__mro__:
            module = sys.modules.get(cls.__module__)
            path = Path(getattr(module, "__file__", "") or "")
            if path.parent == here or here in path.parents:
                files.add(path)
        return sorted(files)

    def versions(self) -> dict[str, str]:
        """The versions of the packages a task's data come from (:attr:`requires`)."""
        if self.requires is None:
            return {}
        from importlib.metadata import version

        return {self.requires: version(self.requires.replace("_", "-"))}

    # --- derived: a run through TRL ------------------------------------------------------------

    @property
    def positions(self) -> int:
        """Positions of the built-in model: a prompt, the longest completion and 7 to spare (the
        reverse model's 40 at 16 digits)."""
        return self.prompt_length + self.completion_length + 7

    def lengths(self) -> tuple[int, int, int] | None:
        """``(prompt tokens, model positions, answer tokens)`` of the built-in model, which the
        CLI checks ``--max_completion_length`` against; None where positions are not bounded."""
        return self.prompt_length, self.positions, self.answer_length

    def dataset(self, seed: int, n: int = 2048) -> Any:
        """``n`` prompts as a ``datasets.Dataset`` with a ``prompt`` column."""
        from datasets import Dataset

        return Dataset.from_dict({"prompt": self.prompts(n, seed=f"train:{seed}")})

    def tokenizer(self) -> Any:
        """The character tokenizer of :attr:`alphabet`."""
        from gmpo_tasks.chars import char_tokenizer

        return char_tokenizer(alphabet=self.alphabet)

    def model(self, seed: int, heads: int | None = None) -> tuple[Any, Any]:
        """``(model, tokenizer)``: the built-in model (``heads`` heads, :attr:`heads` by default),
        warm-started when :attr:`warm` has steps; a warm start is computed once per task,
        setting, seed, heads and process and reported in one line."""
        from gmpo_tasks.warm_start import warm_model

        return warm_model(self, seed, heads=self.heads if heads is None else heads)

    def trainer_args(self, output_dir: str, **overrides: Any) -> dict[str, Any]:
        """``GMPOConfig`` / ``GRPOConfig`` keyword arguments of :attr:`cell`: ``rollouts``
        generations of ``prompts x group`` completions, ``minibatches x epochs`` optimizer
        steps on each (``steps_per_generation`` slices, ``num_iterations`` passes), the
        completion length of the task, no gradient clipping."""
        cell = self.cell
        updates = cell.minibatches * cell.epochs
        args = toy_args(
            output_dir,
            per_device_train_batch_size=cell.prompts * cell.group // cell.minibatches,
            steps_per_generation=cell.minibatches,
            num_iterations=cell.epochs,
            num_generations=cell.group,
            max_completion_length=self.completion_length,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            learning_rate=cell.lr,
            max_grad_norm=0.0,
            max_steps=cell.rollouts * updates,
            logging_steps=updates,
        )
        args.update(overrides)
        return args

    def setting(self) -> str:
        """The run's setting without ``--model``, for ``--help`` (tasks that share one are named
        together)."""
        c = self.cell
        return (
            "a tiny GPT-2-style model warm-started on noisy demonstrations, "
            f"{c.rollouts} generations of {c.prompts} prompts x {c.group} completions, "
            f"{c.minibatches * c.epochs} optimizer steps on each (steps_per_generation="
            f"{c.minibatches}, num_iterations={c.epochs}), learning_rate={c.lr:g}, max_grad_norm=0"
        )


class Backward:
    """The lengths of a task that writes ``length`` characters back to front (``reverse``,
    ``spell_backward``): a prompt of ``length`` characters and ``=``, an answer of ``length``
    characters (at most, where answers vary). Listed before :class:`Task` among the bases."""

    length: int

    @property
    def prompt_length(self) -> int:
        """Tokens of a prompt: the ``length`` characters and ``=``."""
        return self.length + 1

    @property
    def answer_length(self) -> int:
        """Tokens of the answer: the characters written back to front."""
        return self.length
