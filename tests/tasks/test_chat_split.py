"""The chat tasks' held-out split (gmpo_tasks.chat): disjoint from training by construction, for
every seed and dataset size. A question is held out iff the sha256 of its text falls in one
residue class (:func:`gmpo_tasks.chat.held_out_question`); training draws skip held-out questions,
held-out draws take only them, so no training dataset of any seed or size holds a question that
any held-out draw (the evaluation's or the calibration's) can hold."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmpo_tasks.catalog import TASKS

rg = pytest.importorskip("reasoning_gym")
CHAT = [name for name, task in TASKS.items() if task.model_name is not None]


def _questions(entries: list[dict[str, object]]) -> set[str]:
    return {str(e["question"]) for e in entries}


def _training(name: str, seed: int, n: int) -> set[str]:
    """The questions of a run's dataset (``gmpo train --seed seed``: ``Task.dataset``)."""
    return _questions([json.loads(e) for e in TASKS[name].dataset(seed, n=n)["entry"]])


@pytest.mark.parametrize("name", CHAT)
def test_no_training_dataset_holds_a_held_out_question(name: str) -> None:
    task = TASKS[name]
    held = _questions(task.held_out(32))
    calibration = set().union(*(_questions(task.held_out(32, seed=f"calibration:{s}"))
                                for s in (900, 901, 902)))  # fmt: skip
    assert _training(name, 0, 200) == _questions(task.entries(200, seed="train:0"))
    for seed in range(12):
        for n in (1, 16, 200):
            train = _questions(task.entries(n, seed=f"train:{seed}"))  # Task.dataset's draws
            assert not train & held, (seed, n, sorted(train & held)[:3])
            assert not train & calibration, (seed, n, sorted(train & calibration)[:3])


@pytest.mark.parametrize("name", CHAT)
@given(seed=st.integers(0, 10**9) | st.text(max_size=8), n=st.integers(1, 64))
def test_the_split_is_a_residue_class_of_the_questions_hash(
    name: str, seed: object, n: int
) -> None:
    """Whatever the seed and size, a training draw holds no held-out question and a held-out draw
    only held-out ones: the class of a question is a function of its text alone."""
    from gmpo_tasks.chat import HELD_OUT_EVERY, held_out_question

    task = TASKS[name]

    def held(q: str) -> bool:  # the rule, written again here
        digest = hashlib.sha256(" ".join(q.split()).encode()).digest()
        return int.from_bytes(digest[:8], "big") % HELD_OUT_EVERY == 0

    train = task.entries(n, seed=f"train:{seed}")
    out = task.held_out(n, seed=str(seed))
    assert len(train) == len(out) == n
    assert not any(held(q) or held_out_question(q) for q in _questions(train))
    assert all(held(q) and held_out_question(q) for q in _questions(out))


@pytest.mark.parametrize("name", CHAT)
def test_the_held_out_class_is_a_fair_share_of_the_questions(name: str) -> None:
    """The held-out class holds at least 10 distinct questions, and about one in HELD_OUT_EVERY
    of the distinct questions where the gym asks 1000 or more."""
    from gmpo_tasks.chat import HELD_OUT_EVERY, held_out_question

    data = TASKS[name].gym_dataset(20000, "share")
    questions = {data[i]["question"] for i in range(20000)}
    held = [q for q in questions if held_out_question(q)]
    assert len(held) >= 10
    if len(questions) >= 1000:
        assert abs(len(held) / len(questions) - 1 / HELD_OUT_EVERY) < 0.03
