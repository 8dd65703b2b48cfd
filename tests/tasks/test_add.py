"""The `add` task (gmpo_tasks.add): prompts, reward, demonstrations, and that its answer is no
copy of its prompt."""

from __future__ import annotations

import random

import pytest

from gmpo_tasks import add
from gmpo_tasks.add import AddTask
from gmpo_tasks.chars import decode, encode


def test_target_is_the_sum_least_significant_digit_first() -> None:
    # the operands are written least significant digit first, as the answer
    assert add.target("10000000+90000000=") == "010000000"  # 1 + 9 = 10: a carry
    assert add.target("99999999+10000000=") == "000000001"  # 100000000: a carry through all 8
    assert add.target("21+43=") == "640"  # 12 + 34 = 46
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randrange(10**8), rng.randrange(10**8)
        prompt = f"{a:08d}"[::-1] + "+" + f"{b:08d}"[::-1] + "="
        assert int(add.target(prompt)[::-1]) == a + b and len(add.target(prompt)) == 9


def test_prompts_reward_and_lengths() -> None:
    task = AddTask(length=8)
    prompts = task.prompts(50, seed=3)
    assert prompts == task.prompts(50, seed=3) != task.prompts(50, seed=4)
    assert all(len(p) == task.prompt_length == 18 and p[8] == "+" and p[-1] == "=" for p in prompts)
    assert decode(encode(prompts[0])) == prompts[0]  # the study's alphabet has "+"
    right = [add.target(p) for p in prompts]
    assert task.reward(prompts, right) == [1.0] * 50
    assert task.reward(prompts, [r + "a" for r in right]) == [1.0] * 50  # after L + 1: ignored
    wrong = [r[:-1] + str((int(r[-1]) + 1) % 10) for r in right]
    assert task.reward(prompts, wrong) == [0.0] * 50
    assert task.answer_length == 9


def test_no_answer_token_copies_a_prompt_token() -> None:
    """Every answer digit is a function of two prompt digits and a carry: at no pair of
    positions does the answer repeat the prompt much more often than chance (1 in 10)."""
    task = AddTask(length=8)
    prompts = task.prompts(2000, seed=0)
    answers = [add.target(p) for p in prompts]
    for j in range(task.answer_length - 1):  # the last digit is the final carry: 0 or 1
        for i in range(task.prompt_length - 2):
            if i == 8:  # "+"
                continue
            same = sum(a[j] == p[i] for p, a in zip(prompts, answers, strict=True)) / 2000
            assert same < 0.2, (i, j, same)


def test_demonstrations_noise() -> None:
    task = AddTask(length=8, noise=0.2)
    demos = task.demonstrations(500, seed=0)
    assert demos == task.demonstrations(500, seed=0) != task.demonstrations(500, seed=1)
    wrong = sum(a != b for p, c in demos for a, b in zip(add.target(p), c, strict=True))
    # 4500 digits, each wrong w.p. 0.2 * 0.9 = 0.18: 810 expected, binomial std ~26
    assert 710 < wrong < 910
    clean = AddTask(length=8, noise=0.0).demonstrations(50, seed=0)
    assert all(c == add.target(p) for p, c in clean)
    assert task.expected_warm_reward() == pytest.approx(0.82**9)


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="length"):
        AddTask(length=0)
    with pytest.raises(ValueError, match="noise"):
        AddTask(noise=-0.1)
