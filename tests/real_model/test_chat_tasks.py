"""The chat tasks (gmpo_tasks.chat): the gym's question and the answer format as one user
message, the gym's own score of the answer in the reply, the format reward, and seeds that keep
training, held-out and calibration prompts apart."""

from __future__ import annotations

import json

import pytest

from gmpo_tasks import gym
from gmpo_tasks.catalog import TASKS
from gmpo_tasks.chat import held_out_question

rg = pytest.importorskip("reasoning_gym")
CHAT = [name for name, task in TASKS.items() if task.model_name is not None]


def test_the_chat_tasks() -> None:
    assert CHAT == ["chat_chain_sum", "chat_spell_backward", "chat_arith"]
    assert all(TASKS[n].model_name == "smollm2-135m" and TASKS[n].lengths() is None for n in CHAT)


@pytest.mark.parametrize("name", CHAT)
def test_prompts_are_the_gyms_questions_as_user_messages(name: str) -> None:
    task = TASKS[name]
    data = task.dataset(seed=3, n=20)
    entries = [json.loads(e) for e in data["entry"]]
    seed = gym.gym_seed(f"{name}:{task.length}:train:3")
    gyms = list(rg.create_dataset(task.gym_name, size=100, seed=seed, **task.config()))
    training = [e for e in gyms if not held_out_question(e["question"])][:20]
    assert entries == json.loads(json.dumps(training))  # the gym's own, held-out ones skipped
    for prompt, entry in zip(data["prompt"], entries, strict=True):
        assert prompt == [{"role": "user", "content": f"{entry['question']} {task.instruction}"}]
    assert task.dataset(seed=3, n=20)["prompt"] == data["prompt"]
    assert task.dataset(seed=4, n=20)["prompt"] != data["prompt"]


@pytest.mark.parametrize("name", CHAT)
def test_held_out_and_calibration_prompts_are_no_training_prompts(name: str) -> None:
    task = TASKS[name]
    train = {
        q for s in range(5) for q in (e["question"] for e in task.entries(200, seed=f"train:{s}"))
    }
    held = [e["question"] for e in task.held_out(32)]
    calib = [e["question"] for s in (900, 901, 902)
             for e in task.held_out(32, seed=f"calibration:{s}")]  # fmt: skip
    assert task.held_out(32) == task.held_out(32) != task.held_out(32, seed="calibration:900")
    # disjoint by construction (tests/tasks/test_chat_split.py): held-out questions only
    assert not set(held) & train and not set(calib) & train


def _msg(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_chain_sum_scores_the_last_number_by_the_gym() -> None:
    task = TASKS["chat_chain_sum"]
    entry = {"question": "State the final answer to the following arithmetic problem: 4 - 7 =",
             "answer": "-3", "metadata": {}}  # fmt: skip
    replies = [
        "-3",
        "The answer is -3.",
        "4 - 7 = -3",
        "4 - 7 = 3",
        "-03",
        "+3",
        "no number",
        "-31",
    ]
    got = task.reward([None] * 8, [_msg(r) for r in replies], entry=[json.dumps(entry)] * 8)
    gym = rg.create_dataset("chain_sum", size=1, seed=0)
    want = [gym.score_answer(a, entry) for a in ["-3", "-3", "-3", "3", "-03", "+3", "", "-31"]]
    assert got == want == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 2 / 3]
    assert task.format_reward(None, [_msg(r) for r in replies]) == [1, 0, 0, 0, 1, 1, 0, 1]
    # plain-text completions (a dataset without chat messages) are read as they are
    assert task.reward(["p"], ["so -3"], entry=[entry]) == [1.0]


def test_spell_backward_scores_the_last_word_by_the_gym() -> None:
    task = TASKS["chat_spell_backward"]
    entry = {"question": "Spell this word backward (example: sun -> nus): bird", "answer": "drib",
             "metadata": {"word": "bird"}}  # fmt: skip
    replies = ["drib", "Backward: DRIB.", "dirb", "drib!!", "bird -> drab", "1234"]
    got = task.reward([None] * 6, [_msg(r) for r in replies], entry=[json.dumps(entry)] * 6)
    assert got == [1.0, 1.0, 0.5, 1.0, 0.75, 0.0]
    assert task.format_reward(None, [_msg(r) for r in replies]) == [1, 0, 1, 0, 0, 0]


def test_the_reward_needs_the_entry_column() -> None:
    with pytest.raises(TypeError, match="'entry'"):  # a parameter without a default
        TASKS["chat_chain_sum"].reward(["p"], ["3"])
