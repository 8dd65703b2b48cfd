"""chat_arith (gmpo_tasks.chat_arith): the question space counted, and over 100 times the questions
a run and its held-out evaluation draw; the gym's questions and reward, in chat format."""

from __future__ import annotations

import inspect

import pytest

from gmpo_tasks.catalog import TASKS
from gmpo_tasks.chat_arith import ChatArithTask

rg = pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize(("terms", "low", "high", "draws"), [(2, 1, 1, 20_000), (3, 1, 1, 60_000)])
def test_the_count_of_questions_is_what_the_gym_asks(
    terms: int, low: int, high: int, draws: int
) -> None:
    """Where the space is small enough to see whole, the gym's distinct questions are counted."""
    task = ChatArithTask(length=terms, min_digits=low, max_digits=high)
    data = task.gym_dataset(draws, "count")
    seen = {data[i]["question"] for i in range(draws)}
    assert len(seen) == task.questions()


def test_the_counts_formula() -> None:
    # one digit: 0-9; two: 10-99; three: 100-999; 2 ** (terms - 1) operator strings
    assert ChatArithTask(length=2, min_digits=1, max_digits=2).questions() == 200 + 90**2 * 2
    assert ChatArithTask(length=3, min_digits=2, max_digits=2).questions() == 90**3 * 4


def test_the_space_is_over_100_times_what_a_run_draws() -> None:
    """A run draws its dataset's rows (ChatTask.dataset's default, 2048: it trains on
    ``generations x prompts`` = 40 of them) and the held-out evaluation's prompts (32)."""
    pytest.importorskip("trl")
    from gmpo_trl.cli.held_out import PROMPTS

    task = TASKS["chat_arith"]
    rows = inspect.signature(task.dataset).parameters["n"].default
    trained = task.settings.generations * task.settings.prompts
    assert (rows, PROMPTS, trained) == (2048, 32, 40)
    assert task.questions() == 10**2 * 2 + 90**2 * 2 + 900**2 * 2 == 1_636_400
    assert task.questions() / (rows + PROMPTS) == pytest.approx(786.7, abs=0.1)
    assert task.questions() / (trained + PROMPTS) == pytest.approx(22727.8, abs=0.1)


def test_questions_are_the_gyms_chain_sum_in_chat_format() -> None:
    task = TASKS["chat_arith"]
    entries = task.entries(200, seed="look")
    assert {e["metadata"]["num_terms"] for e in entries} == {2}
    assert {e["metadata"]["num_digits"] for e in entries} == {1, 2, 3}
    e = entries[0]
    assert task.messages(e) == [{"role": "user",
                                 "content": f"{e['question']} Reply with the number only."}]  # fmt: skip
    reply = [{"role": "assistant", "content": f"{e['metadata']['expression']} = {e['answer']}.0"}]
    assert task.reward(None, [reply], entry=[e]) == [1.0]
    with pytest.raises(ValueError, match="digits"):
        ChatArithTask(min_digits=3, max_digits=2)
