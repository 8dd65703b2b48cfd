"""Tasks over reasoning-gym's seeded datasets (``pip install -e '.[gym]'`` in the clone: reasoning-gym 0.1.25).

A subclass of :class:`GymTask` names one of the gym's datasets (its ``name`` is the gym's), the
dataset's configuration at the task's ``length``, and how an entry (the gym's ``question``,
``answer`` and ``metadata``) is written for a tiny character model: a compact prompt of one
length built from the entry's metadata, and the answer the demonstrations show. What stays the
gym's own: the entries (``reasoning_gym.create_dataset(name, size=n, seed=s, **config)``) and the
reward, the dataset's ``score_answer(completion, entry)``.

The reward needs the entry behind a prompt. :meth:`GymTask.prompts` keeps each entry it draws
in a map from prompt to entry (per process; the study's worker processes and TRL's trainer draw
their prompts in the process that scores them). :meth:`GymTask.dataset` also carries each
entry as a JSON column ``entry``, which TRL hands to the reward with the prompts. A prompt found
in neither (a fresh process scoring saved prompts) is scored against the entry rebuilt from
the prompt itself, which holds every field the gym's ``score_answer`` reads
(:meth:`GymTask.rebuild`; tests/tasks/test_gym_tasks.py checks that both score alike).

Seeds: the study draws prompts with string seeds (``"seed:step"``); a seed maps to the gym's
integer seed through sha256, the same in every process. reasoning_gym is imported only when a
prompt is drawn or scored, never when this module is.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from gmpo_tasks.task import Task

#: entries (and scores) kept per process, oldest dropped first: a warm start draws 64 a
#: step, a study step 16, a TRL dataset 2048; a dropped prompt is scored by its rebuilt entry
MAX_ENTRIES = 1 << 14
_ENTRIES: dict[tuple[str, str], dict[str, Any]] = {}
#: scores kept per process ((task, prompt, completion) -> reward): a small policy repeats
#: completions, and countdown's score_answer parses each with sympy (about 0.5 ms)
_SCORES: dict[tuple[Any, str, str], float] = {}


@cache
def _base_dataset(name: str, config: tuple[tuple[str, Any], ...]) -> Any:
    """The gym's dataset of ``config`` (built once per process: spell_backward reads its word
    list, about 40 ms); :meth:`GymTask.gym_dataset` gives it a seed and a size."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=1, seed=0, **dict(config))


def gym_seed(text: str) -> int:
    """A 56-bit integer seed of a string, the same in every process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def _remember(key: tuple[Any, ...], value: Any, store: dict[Any, Any]) -> None:
    """Keep ``value`` under ``key`` as the newest item of ``store``, dropping the oldest where
    the store is full. A key drawn again moves to the newest place (a dict keeps an updated key
    where it was): what this batch drew is dropped only after everything drawn before it."""
    store.pop(key, None)
    if len(store) >= MAX_ENTRIES:
        del store[next(iter(store))]
    store[key] = value


@dataclass(frozen=True)
class GymTask(Task):
    """A task over a reasoning-gym dataset: subclasses give :meth:`config`, :meth:`compact`,
    :meth:`rebuild`, :meth:`answer` and the two lengths."""

    requires: ClassVar[str | None] = "reasoning_gym"
    extra: ClassVar[str | None] = "gym"
    #: the gym's name of the dataset, where it is not the task's
    gym_name: ClassVar[str] = ""

    # --- what a gym task module gives ----------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """The gym dataset's configuration (keyword arguments of ``create_dataset``)."""
        raise NotImplementedError

    def compact(self, entry: dict[str, Any]) -> str:
        """The prompt of an entry, from its metadata: ``prompt_length`` characters."""
        raise NotImplementedError

    def rebuild(self, prompt: str) -> dict[str, Any]:
        """An entry with every field ``score_answer`` reads, from the compact prompt alone."""
        raise NotImplementedError

    def answer(self, entry: dict[str, Any]) -> str:
        """The demonstrations' answer of an entry (the gym's answer, in the task's alphabet)."""
        raise NotImplementedError

    # --- the gym's dataset ----------------------------------------------------------------------

    def gym_dataset(self, n: int, seed: int | str) -> Any:
        """The gym's dataset of :meth:`config` with ``n`` entries and the integer seed of
        ``seed``: what ``create_dataset(name, size=n, seed=..., **config)`` gives, without
        rebuilding what the configuration alone decides (a copy of :func:`_base_dataset` with
        the seed and the size the gym's constructor sets)."""
        base = _base_dataset(self.gym_name or self.name, tuple(sorted(self.config().items())))
        data = copy.copy(base)
        data.seed = gym_seed(f"{self.name}:{self.length}:{seed}")
        data.size = n
        data.config = dataclasses.replace(base.config, seed=data.seed, size=n)
        return data

    def entries(self, n: int, *, seed: int | str) -> list[dict[str, Any]]:
        """``n`` entries of the gym's dataset, the same for the same ``seed``; each is kept
        under its prompt (:meth:`entry`)."""
        out = list(self.gym_dataset(n, seed))
        for e in out:
            _remember((self.name, self.compact(e)), e, _ENTRIES)
        return out

    def entry(self, prompt: str, given: str | dict[str, Any] | None = None) -> dict[str, Any]:
        """The entry behind ``prompt``: ``given`` (an entry, or its JSON as a dataset column
        carries it), else the last one :meth:`prompts` drew with this prompt in this process,
        else the entry rebuilt from the prompt. Entries that share a prompt score alike; where
        their answers differ (countdown's), a demonstration shows the answer of the last one
        drawn, in its own batch: the same whatever the process drew before."""
        if given is not None:
            return json.loads(given) if isinstance(given, str) else given
        found = _ENTRIES.get((self.name, prompt))
        return found if found is not None else self.rebuild(prompt)

    def score(self, completion: str, entry: dict[str, Any]) -> float:
        """The gym's own ``score_answer(completion, entry)``."""
        data = _base_dataset(self.gym_name or self.name, tuple(sorted(self.config().items())))
        return float(data.score_answer(completion, entry))

    # --- Task ----------------------------------------------------------------------------------

    def prompts(self, n: int, *, seed: int | str) -> list[str]:
        """The compact prompts of ``n`` entries of the gym's dataset (:meth:`entries`)."""
        return [self.compact(e) for e in self.entries(n, seed=seed)]

    def target(self, prompt: str) -> str:
        """The demonstrations' answer of the entry behind ``prompt``."""
        return self.answer(self.entry(prompt))

    def reward(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        entry: Sequence[str | dict[str, Any]] | None = None,
        **_: Any,
    ) -> list[float]:
        """Per completion, the gym's ``score_answer`` of its first ``answer_length``
        characters against the prompt's entry (TRL's signature: ``entry`` is the dataset column
        of that name, where it has one). What follows is not read, as the study reads it: TRL
        passes a completion that sampled no end-of-sequence token whole."""
        given = list(entry) if entry is not None else [None] * len(prompts)
        out = []
        for prompt, whole, e in zip(prompts, completions, given, strict=True):
            completion = whole[: self.answer_length]
            if e is not None:
                out.append(self.score(completion, self.entry(prompt, e)))
                continue
            key = (self, prompt, completion)
            if key not in _SCORES:
                _remember(key, self.score(completion, self.entry(prompt)), _SCORES)
            out.append(_SCORES[key])
        return out

    def dataset(self, seed: int, n: int = 2048) -> Any:
        """``n`` prompts as a ``datasets.Dataset`` with a ``prompt`` column and the gym's entry
        of each as JSON (``entry``, which TRL passes to :meth:`reward`)."""
        from datasets import Dataset

        entries = self.entries(n, seed=f"train:{seed}")
        return Dataset.from_dict({"prompt": [self.compact(e) for e in entries],
                                  "entry": [json.dumps(e) for e in entries]})  # fmt: skip
