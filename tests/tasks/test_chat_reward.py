"""The chat tasks' reward on numbers (gmpo_tasks.chat): the answer of a reply is its last number,
read whole (sign, thousands separators, decimal part), and scored by reasoning-gym's own
``score_answer``, so that ``12.0`` is 12, and ``2.5`` or ``1,000`` are not 5 or 0."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmpo_tasks.catalog import TASKS

rg = pytest.importorskip("reasoning_gym")
#: the chat tasks whose answer is a number
NUMERIC = [n for n, t in TASKS.items() if t.model_name is not None and t.gym_name == "chain_sum"]


def _entry(answer: str) -> dict[str, object]:
    return {"question": "State the final answer to the following arithmetic problem: ? =",
            "answer": answer, "metadata": {}}  # fmt: skip


def _score(name: str, reply: str, answer: str) -> float:
    task = TASKS[name]
    return task.reward([None], [[{"role": "assistant", "content": reply}]],
                       entry=[json.dumps(_entry(answer))])[0]  # fmt: skip


def _gym(answer_in_reply: str, answer: str) -> float:
    return float(rg.create_dataset("chain_sum", size=1, seed=0).score_answer(
        answer_in_reply, _entry(answer)))  # fmt: skip


#: (reply, the right answer, the number the gym should be given, the reward)
TABLE = [
    # the cases: a decimal or a separator is part of the number
    ("12.0", "12", "12.0", 1.0),
    ("2.5", "5", "2.5", 1 / 3),
    ("3.0", "0", "3.0", 1 / 3),
    ("1,000", "0", "1,000", 0.25),
    ("1,000", "1000", "1,000", 1.0),
    ("12.", "12", "12", 1.0),  # a full stop ends the sentence
    ("12.5", "12", "12.5", 0.5),
    # signs and leading zeros
    ("-3", "-3", "-3", 1.0),
    ("+04", "4", "+04", 1.0),
    ("-03", "-3", "-03", 1.0),
    ("+3", "-3", "+3", 0.0),
    ("-31", "-3", "-31", 2 / 3),
    # a number inside a sentence or an equation: the last one
    ("The answer is 12.0, I think.", "12", "12.0", 1.0),
    ("The sum is 1,234.", "1234", "1,234", 1.0),
    ("4 - 7 = -3", "-3", "-3", 1.0),
    ("4-7=-3", "-3", "-3", 1.0),
    ("10-3", "7", "3", 0.0),  # a minus between two numbers is no sign
    ("4 - 7 = 3", "-3", "3", 0.0),
    ("It is 5. Or 2.5?", "5", "2.5", 1 / 3),
    ("no number", "3", "", 0.0),
]


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize(("reply", "answer", "number", "want"), TABLE)
def test_the_last_number_read_whole_scored_by_the_gym(
    name: str, reply: str, answer: str, number: str, want: float
) -> None:
    assert TASKS[name].extract(reply) == number
    assert _score(name, reply, answer) == pytest.approx(want)
    assert _score(name, reply, answer) == _gym(number, answer)


#: a number written as a reply may write it: sign, leading zeros, separators, a decimal part
_numbers = st.builds(
    lambda sign, zeros, value, sep, frac: (
        sign + "0" * zeros + (f"{value:,}" if sep else str(value)) + frac
    ),
    st.sampled_from(["", "+", "-"]),
    st.integers(0, 2),
    st.integers(0, 10**7),
    st.booleans(),
    st.sampled_from(["", ".0", ".00", ".5", ".25"]),
)


@given(reply=_numbers, answer=st.integers(-(10**7), 10**7), words=st.sampled_from(
    ["{}", " {} ", "The answer is {}.", "So: {}", "x = {}\n"]))  # fmt: skip
def test_a_bare_number_scores_as_the_gyms_score_answer(reply: str, answer: int, words: str) -> None:
    """Where the reply is the number alone the gym's score_answer of the whole reply and the
    task's agree; around words, the task scores the number as the gym scores it alone."""
    for name in NUMERIC:
        assert TASKS[name].extract(words.format(reply)) == reply
        assert _score(name, words.format(reply), str(answer)) == _gym(reply, str(answer))
        if words == "{}":
            assert _score(name, reply, str(answer)) == _gym(reply, str(answer))
