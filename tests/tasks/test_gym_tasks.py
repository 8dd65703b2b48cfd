"""The reasoning-gym tasks (gmpo_tasks.chain_sum, countdown, spell_backward): seeded prompts of one
length, the gym's own reward, the prompt -> entry lookup (in a fresh process too), the
demonstrations' noise, and answers of varying length through the study (without reasoning_gym:
test_gym_extra.py)."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys

import pytest

from gmpo_tasks import gym
from gmpo_tasks.catalog import TASKS
from studies.stability.sweep import read_curves
from tests.tasks.test_gym_extra import GYM, ROOT, _path

rg = pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize("name", GYM)
def test_prompts_are_seeded_of_one_length_and_the_gyms_entries(name: str) -> None:
    task = TASKS[name]
    a = task.prompts(60, seed="3:7")
    assert a == task.prompts(60, seed="3:7") != task.prompts(60, seed="3:8")
    assert task.prompts(5, seed=3) == task.prompts(5, seed="3")  # an int seed is its string
    assert all(len(p) == task.prompt_length and set(p) <= set(task.symbols) for p in a)
    assert len(set(a)) > 40  # distinct prompts, not one repeated
    # the entries are the gym's: create_dataset with the seed's integer
    seed = gym.gym_seed(f"{name}:{task.length}:3:7")
    gyms = list(rg.create_dataset(name, size=60, seed=seed, **task.config()))
    assert task.entries(60, seed="3:7") == gyms
    assert [task.compact(e) for e in gyms] == a


@pytest.mark.parametrize("name", GYM)
def test_the_reward_is_the_gyms_score_answer(name: str) -> None:
    task = TASKS[name]
    data = rg.create_dataset(name, size=1, seed=0, **task.config())
    entries = task.entries(100, seed="reward")
    prompts = [task.compact(e) for e in entries]
    rng = random.Random(0)
    answers = [task.target(p) for p in prompts]
    assert task.reward(prompts, answers) == [1.0] * 100
    wrong = ["".join(rng.choices(task.answer_chars, k=len(a))) for a in answers]
    wrong[:3] = ["", answers[3] + answers[3], answers[4][:-1]]
    got = task.reward(prompts, wrong)
    # the gym's score of the answer's characters (what follows them is not read)
    n = task.answer_length
    assert got == [data.score_answer(c[:n], e) for c, e in zip(wrong, entries, strict=True)]
    assert 0 < sum(x < 1 for x in got)  # the wrong ones are wrong, by the gym's measure


def test_the_gyms_partial_rewards() -> None:
    chain, count, spell = (TASKS[n] for n in GYM)
    # the number however written; a completion that contains it: len(answer) / len(completion)
    assert chain.reward(["4-1-7="] * 6, ["-4", "-04", "4", "-4-", "-4-4", "x"]) == [
        1.0, 1.0, 0.0, pytest.approx(2 / 3), pytest.approx(2 / 3), 0.0]  # fmt: skip
    # every order and sign that reaches the target is right; other numbers 0.05; no parse 0.01
    assert count.reward(["396:12="] * 5, ["9-3+6", "6+9-3", "9+6-3", "9+3+6", "9-3+"]) == [
        1.0, 1.0, 1.0, 0.05, 0.01]  # fmt: skip
    # case-insensitive; the fraction of positions; 0.8 for a right answer run past its end
    assert spell.reward(["...splat="] * 4, ["talps", "TALPS", "taxps", "talpsx"]) == [
        1.0, 1.0, pytest.approx(0.8), pytest.approx(0.8)]  # fmt: skip


@pytest.mark.parametrize("name", GYM)
def test_an_entry_rebuilt_from_its_prompt_scores_as_the_gyms(name: str) -> None:
    task = TASKS[name]
    rng = random.Random(1)
    for e in task.entries(80, seed="rebuild"):
        prompt, answer = task.compact(e), task.answer(e)
        rebuilt = task.rebuild(prompt)
        tries = [answer, answer[::-1], answer[1:], "", task.answer(rebuilt),
                 "".join(rng.choices(task.answer_chars, k=len(answer)))]  # fmt: skip
        assert [task.score(c, rebuilt) for c in tries] == [task.score(c, e) for c in tries]
        assert task.score(task.answer(rebuilt), e) == 1.0  # the rebuilt answer is right


def test_the_entry_column_and_a_fresh_process() -> None:
    task = TASKS["countdown"]
    data = task.dataset(seed=5, n=30)
    assert data.column_names == ["prompt", "entry"]
    prompts, entries = list(data["prompt"]), list(data["entry"])
    completions = [task.target(p) for p in prompts[:15]] + ["1+2+3"] * 15
    here = task.reward(prompts, completions)
    assert sum(here) == pytest.approx(15 + 15 * 0.05)
    # TRL passes the dataset's columns: the entry column is the gym's entry
    assert task.reward(prompts, completions, entry=entries) == here
    assert json.loads(entries[0]) == json.loads(json.dumps(task.entry(prompts[0])))
    # a fresh process that drew no prompt scores them alike (from the rebuilt entries)
    code = (
        "import json, sys; from gmpo_tasks import gym; from gmpo_tasks.catalog import TASKS; "
        "p, c = json.loads(sys.stdin.read()); t = TASKS['countdown']; "
        "print(json.dumps([t.reward(p, c), len(gym._ENTRIES)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps([prompts, completions]),
                         capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": _path(), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert json.loads(out.stdout) == [here, 0]


# Regression: a prompt drawn before and drawn again kept its old place in the store's eviction
# order, so later draws of the same batch could drop it; its demonstration then showed the
# answer of the entry rebuilt from the prompt, and a seed's warm start depended on what its
# process had drawn before.
def test_a_batchs_prompts_keep_its_entries_whatever_the_process_drew_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = dataclasses.replace(TASKS["countdown"], length=4)
    batch = task.entries(16, seed="batch")
    drawn = {task.compact(e): e for e in batch}  # the last drawn entry of each prompt
    first = task.compact(batch[0])
    assert task.answer(task.rebuild(first)) != task.answer(drawn[first])  # two answers
    # a store one prompt short of full after the batch: the first prompt drawn before, and one
    # other prompt
    monkeypatch.setattr(gym, "MAX_ENTRIES", len(drawn))
    monkeypatch.setattr(gym, "_ENTRIES", {(task.name, first): batch[0], (task.name, "x"): {}})
    assert task.entries(16, seed="batch") == batch
    assert {p: task.entry(p) for p in drawn} == drawn
    assert [task.target(p) for p in drawn] == [task.answer(e) for e in drawn.values()]


@pytest.mark.parametrize("name", GYM)
def test_demonstrations_noise_rate(name: str) -> None:
    task = dataclasses.replace(TASKS[name], noise=0.3)
    other = task.demonstrations(400, seed=1)
    demos = task.demonstrations(400, seed=0)
    # the answers of the entries just drawn (countdown: the last drawn of a prompt's entries)
    answers = [task.target(p) for p, _ in demos]
    assert demos == task.demonstrations(400, seed=0) != other
    assert all(len(a) == len(c) for a, (_, c) in zip(answers, demos, strict=True))
    chars = sum(len(a) for a in answers)
    wrong = sum(x != y for a, (_, c) in zip(answers, demos, strict=True)
                for x, y in zip(a, c, strict=True))  # fmt: skip
    rate = 0.3 * (1 - 1 / len(task.answer_chars))  # a replacement may draw the right one
    std = (chars * rate * (1 - rate)) ** 0.5
    assert abs(wrong - chars * rate) < 4 * std, (wrong, chars * rate, std)
    clean = dataclasses.replace(task, noise=0.0).demonstrations(50, seed=0)
    assert all(c == task.target(p) for p, c in clean)


def test_answers_of_varying_length_through_the_study() -> None:
    """chain_sum's answers (1 to 3 characters) through the study: roll_out's mask ends at the
    first end-of-sequence token and its texts stop before it; a short warm start learns to end
    its answers there."""
    import torch

    from studies.stability.run import Setup, roll_out, warm_start

    torch.set_num_threads(1)  # a tiny model: a second thread only waits
    setup = Setup.of("chain_sum", warm_steps=150, prompts=4, minibatches=2, steps=2)
    eos = len(setup.vocab)
    prompts = setup.task.prompts(64, seed="roll")
    model = setup.model()
    out = roll_out(model, setup, prompts, torch.Generator().manual_seed(0))
    comps = out.sample.completions
    assert comps.shape == (64, 4) and out.mask.shape == (64, 4)
    for row, mask, text in zip(comps.tolist(), out.mask.tolist(), out.texts, strict=True):
        first = row.index(eos) if eos in row else len(row)
        assert mask == [i <= first for i in range(len(row))]
        assert text == "".join(setup.vocab[t] for t in row[:first][:3])
    warm = warm_start(setup, 0)
    model.load_state_dict(warm["state"])
    out = roll_out(model, setup, prompts, torch.Generator().manual_seed(0))
    ended = (out.sample.completions == eos).any(1).float().mean()
    assert ended > 0.9 and len({len(t) for t in out.texts}) >= 2, (ended, out.texts)
    assert 0 < warm["reward"] < 1


def test_the_studys_quick_run_on_a_gym_task(tmp_path) -> None:
    """``python -m studies.stability --task chain_sum --quick`` (one method and seed): the
    records name the task, and its completions vary in length."""
    cmd = [sys.executable, "-m", "studies.stability", "--task", "chain_sum", "--quick",
           "--variants", "gmpo", "--seeds", "0", "--workers", "1", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=300, cwd=ROOT,
                   env={"PYTHONPATH": _path(), "PATH": "/usr/bin:/bin"})  # fmt: skip
    records = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["task"], r["variant"], r["seed"]) for r in records] == [("chain_sum", "gmpo", 0)]
    curves = read_curves(tmp_path)[0]["curves"]
    # at 2 terms, answers of 1 or 2 characters and the end-of-sequence token: 2 to 3 tokens
    assert len(curves["length"]) == 6 and all(1 <= x <= 3 for x in curves["length"])
    assert '"length": 2' in (tmp_path / "summary.md").read_text()
