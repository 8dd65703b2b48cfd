"""Tasks for a pretrained instruct model: reasoning-gym's questions as chat messages, the gym's
own reward.

A :class:`ChatTask` is a :class:`~gmpo_tasks.gym.GymTask` written for a chat model rather than a
tiny character model: a prompt is one user message (TRL's conversational format, which the
model's chat template renders), the gym's own question followed by the task's
:attr:`~ChatTask.instruction`, which states the answer format. Its dataset carries each entry as
JSON (``entry``), which TRL hands to the reward with the completions.

The reward is the gym's ``score_answer(answer, entry)``, where ``answer`` is the last match of
the task's :attr:`~ChatTask.answer_pattern` in the reply (the last number, say), or ``""`` where
there is none. Scoring the whole reply instead (the gym's default) gives a 135M model almost
nothing: it writes sentences around its answer, and the gym scores a reply that contains the
answer by ``len(answer) / len(reply)`` (0.02 on average for the untrained model, against 0.18
for the last number: results/real-model/calibration.md). :meth:`ChatTask.format_reward` is the
answer format itself (1 for a reply that is the answer alone, else 0), which ``--format_reward``
adds to the task's reward.

**The held-out split is disjoint from training by construction.** A question is held out iff the
sha256 of its text (whitespace collapsed) falls in one residue class modulo
:data:`HELD_OUT_EVERY` (:func:`held_out_question`): a function of the question alone, the same
for every seed, dataset size, task and process. Training draws (:meth:`ChatTask.entries`,
:meth:`ChatTask.dataset`) skip the held-out questions and held-out draws
(:meth:`ChatTask.held_out`: the evaluation's and the calibration's) take only them, walking the
gym's seeded sequence of entries until they have ``n``; so no training dataset of any seed and
size holds a question any held-out draw can hold (tests/tasks/test_chat_split.py).

A run trains :attr:`~ChatTask.model_name` (``gmpo_tasks.pretrained``) unless ``--model`` names
another chat model, with the task's :attr:`~ChatTask.settings`, chosen by measurement on two
cores (docs/real_model.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gmpo_tasks.gym import _ENTRIES, GymTask, _remember

#: a number as a reply writes it, read whole: a sign (not a minus between two numbers: ``10-3``
#: is 10 and 3), digits with any commas between them (the gym strips commas: ``1,000`` is 1000),
#: and a decimal part (``12.0`` is 12, ``2.5`` is not 5; a full stop after it ends a sentence);
#: the gym's ``score_answer`` parses it
NUMBER = re.compile(r"(?:(?<![\w.)])[+-])?\d+(?:,\d+)*(?:\.\d+)?")

#: one question in this many is held out (its hash's residue class): about 12%
HELD_OUT_EVERY = 8
#: draws without a question of the wanted class, per question wanted, before a draw gives up (a
#: question space whose held-out class is empty or nearly so)
MAX_MISSES = 1000


def held_out_question(question: str) -> bool:
    """Whether a question is held out: the sha256 of its text, whitespace collapsed, is 0
    modulo :data:`HELD_OUT_EVERY`. A function of the text alone."""
    digest = hashlib.sha256(" ".join(question.split()).encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_EVERY == 0


@dataclass(frozen=True)
class RealCell:
    """The RL setting of a chat task's run: each generation samples ``group`` completions of at
    most ``completion_length`` tokens at ``temperature`` for each of ``prompts`` prompts, and
    takes ``minibatches`` optimizer steps on each of ``epochs`` passes over it (TRL's
    ``steps_per_generation`` and ``num_iterations``) at learning rate ``lr``; ``generations``
    generations in all."""

    prompts: int = 2
    group: int = 8
    completion_length: int = 32
    temperature: float = 1.0
    minibatches: int = 1
    epochs: int = 2
    generations: int = 20
    lr: float = 2e-5


def reply_text(completion: Any) -> str:
    """The text of a completion: TRL passes a conversational one as a list of messages (the
    assistant's reply last), a plain one as a string."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion is a string or a list of messages, got {completion!r}")


@dataclass(frozen=True)
class ChatTask(GymTask):
    """A reasoning-gym dataset for a chat model. Subclasses give :meth:`config`, the
    :attr:`instruction`, the :attr:`answer_pattern` and the :attr:`format_pattern`."""

    #: appended to the gym's question: the answer format, stated
    instruction: ClassVar[str] = ""
    #: the answer in a reply: its last match
    answer_pattern: ClassVar[re.Pattern[str]] = re.compile(r"\S+")
    #: a reply that is the answer alone, in the stated format (surrounding space aside)
    format_pattern: ClassVar[re.Pattern[str]] = re.compile(r"\S+")
    #: the pretrained model a run trains unless --model names another (gmpo_tasks.pretrained)
    model_name: ClassVar[str | None] = "smollm2-135m"
    settings: ClassVar[RealCell] = RealCell()

    # --- the prompts: the gym's question and the instruction, one user message -----------------

    def compact(self, entry: dict[str, Any]) -> str:
        """The user message of an entry: the gym's question, then the instruction."""
        return f"{entry['question']} {self.instruction}"

    def rebuild(self, prompt: str) -> dict[str, Any]:
        raise ValueError(
            f"the {self.name} task scores a reply against its entry: give the dataset's 'entry' "
            "column (Task.dataset carries it)"
        )

    def answer(self, entry: dict[str, Any]) -> str:
        return str(entry["answer"])

    def messages(self, entry: dict[str, Any]) -> list[dict[str, str]]:
        """The prompt of an entry in TRL's conversational format."""
        return [{"role": "user", "content": self.compact(entry)}]

    def dataset(self, seed: int | str, n: int = 2048) -> Any:
        """``n`` prompts (a user message each) as a ``datasets.Dataset`` with the gym's entry of
        each as JSON (``entry``): training questions only (:meth:`entries`)."""
        from datasets import Dataset

        entries = self.entries(n, seed=f"train:{seed}")
        return Dataset.from_dict({"prompt": [self.messages(e) for e in entries],
                                  "entry": [json.dumps(e) for e in entries]})  # fmt: skip

    def draw(self, n: int, *, seed: int | str, held_out: bool) -> list[dict[str, Any]]:
        """The first ``n`` entries of the gym's sequence of ``seed`` whose question is held out
        (``held_out``) or not (:func:`held_out_question`), the same for the same ``seed``; each
        is kept under its prompt (:meth:`entry`)."""
        data = self.gym_dataset(n, seed)
        out: list[dict[str, Any]] = []
        for index in range(MAX_MISSES * n + MAX_MISSES):
            if len(out) == n:
                break
            e = data[index]
            if held_out_question(e["question"]) == held_out:
                out.append(e)
        if len(out) < n:
            kind = "held-out" if held_out else "training"
            raise ValueError(f"the {self.name} task has too few {kind} questions: {len(out)} of "
                             f"{n} in {index + 1} draws")  # fmt: skip
        for e in out:
            _remember((self.name, self.compact(e)), e, _ENTRIES)
        return out

    def entries(self, n: int, *, seed: int | str) -> list[dict[str, Any]]:
        """``n`` training entries: the gym's entries of ``seed`` whose question is not held out."""
        return self.draw(n, seed=seed, held_out=False)

    def held_out(self, n: int, seed: int | str = "held-out") -> list[dict[str, Any]]:
        """``n`` held-out entries (the evaluation's, or the calibration's with a seed of its
        own): the gym's entries of ``seed`` whose question is held out, which no training draw
        of any seed holds."""
        return self.draw(n, seed=f"held-out:{seed}", held_out=True)

    # --- the rewards ---------------------------------------------------------------------------

    def extract(self, reply: str) -> str:
        """The answer in a reply: the last match of :attr:`answer_pattern`, else ``""``."""
        found = self.answer_pattern.findall(reply)
        return str(found[-1]) if found else ""

    def reward(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        entry: Sequence[str | dict[str, Any]],
        **_: Any,
    ) -> list[float]:
        """Per completion, the gym's ``score_answer`` of the answer in it (:meth:`extract`)
        against its entry (the dataset's ``entry`` column; TRL's reward signature: a parameter
        without a default, so that a dataset without the column is refused before any model
        loads, ``gmpo_trl.rewards.check_reward``)."""
        return [self.score(self.extract(reply_text(c)), self.entry("", e))
                for c, e in zip(completions, entry, strict=True)]  # fmt: skip

    def format_reward(
        self, prompts: Sequence[Any], completions: Sequence[Any], **_: Any
    ) -> list[float]:
        """Per completion, 1.0 when the reply is the answer alone in the stated format
        (:attr:`format_pattern`, surrounding space aside), else 0.0: ``--format_reward``."""
        return [float(self.format_pattern.fullmatch(reply_text(c).strip()) is not None)
                for c in completions]  # fmt: skip

    # --- a run through TRL ---------------------------------------------------------------------

    def lengths(self) -> None:
        """A pretrained model's positions are not the task's to bound."""
        return None

    def trainer_args(self, output_dir: str, **overrides: Any) -> dict[str, Any]:
        """``GMPOConfig`` / ``GRPOConfig`` keyword arguments of :attr:`settings`:
        ``generations`` generations of ``prompts x group`` completions, ``minibatches x
        epochs`` optimizer steps on each, every optimizer step logged, no checkpoints (the
        device and precision are the run's defaults: the CPU's where there is no GPU)."""
        cell = self.settings
        updates = cell.minibatches * cell.epochs
        args: dict[str, Any] = dict(
            output_dir=output_dir,
            seed=0,
            per_device_train_batch_size=cell.prompts * cell.group // cell.minibatches,
            steps_per_generation=cell.minibatches,
            num_iterations=cell.epochs,
            num_generations=cell.group,
            max_completion_length=cell.completion_length,
            temperature=cell.temperature,
            learning_rate=cell.lr,
            lr_scheduler_type="constant",
            max_steps=cell.generations * updates,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
        )
        args.update(overrides)
        return args

    def setting(self) -> str:
        c = self.settings
        return (
            f"the pretrained {self.model_name} (or --model, a chat model), {c.generations} "
            f"generations of {c.prompts} prompts x {c.group} completions of up to "
            f"{c.completion_length} tokens at temperature {c.temperature:g}, "
            f"{c.minibatches * c.epochs} optimizer steps on each (steps_per_generation="
            f"{c.minibatches}, num_iterations={c.epochs}), learning_rate={c.lr:g}"
        )
