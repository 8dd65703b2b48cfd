"""The built-in tasks through the ``gmpo`` command: ``gmpo train --task reverse`` and ``gmpo
compare --task reverse`` (tiny settings: a 3-step warm start, 2 optimizer steps), the task
option's errors, the registry the command reads, and the collapse rule in the compare table."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

import dataclasses

from gmpo_tasks import warm_start
from gmpo_tasks.catalog import TASKS, TINY_TASKS
from gmpo_tasks.reverse import ReverseTask
from gmpo_tasks.warm_start import WarmStart
from gmpo_trl.cli import main, runs
from gmpo_trl.cli.reports import compare_table, read_metrics, run_summary

pytestmark = pytest.mark.trl

PNG = b"\x89PNG\r\n\x1a\n"
TINY = ["--max_steps", "2", "--logging_steps", "1"]


@pytest.fixture
def short_warm_start(monkeypatch):
    """Every task with a 3-step warm start, and no warm start computed yet (they are cached per
    process)."""
    for name, task in TASKS.items():
        if task.warm.steps:
            monkeypatch.setitem(TASKS, name, dataclasses.replace(task, warm=WarmStart(steps=3)))
    monkeypatch.setattr(warm_start, "_WARM_STATES", {})


def test_train_reverse_end_to_end(tmp_path, capsys, short_warm_start):
    assert main(["train", "--task", "reverse", "--output_dir", str(tmp_path), *TINY]) == 0
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # the study's setting: 16 prompts x 8 completions of 16 digits, scored by exact match
    assert rows[0]["completions/max_length"] == 16 and 0.0 <= rows[0]["reward"] <= 1.0
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["model_type"] == "gpt2"  # learned positions (a rotary model cannot reverse)
    assert (tmp_path / "metrics.png").read_bytes().startswith(PNG)
    assert json.loads((tmp_path / "summary.json").read_text())["optimizer_steps"] == 2
    out = capsys.readouterr().out
    assert "warm start (seed 0): 3 supervised steps" in out and "gmpo train: 2 optimizer" in out


def test_reverse_defaults_are_the_study_cell(tmp_path):
    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.parsing import parse

    config = parse("train", ["--task", "reverse", "--output_dir", str(tmp_path)]).config(GMPOConfig)
    assert (config.learning_rate, config.max_grad_norm) == (2e-3, 0.0)
    assert config.generation_batch_size == 128 and config.max_completion_length == 16
    assert (config.steps_per_generation, config.num_iterations, config.max_steps) == (8, 2, 1600)
    toy = parse("train", ["--output_dir", str(tmp_path)]).config(GMPOConfig)
    assert toy.max_completion_length == 1  # the default task is still the toy's


def test_compare_reverse_end_to_end_same_warm_start(tmp_path, capsys, short_warm_start,
                                                    monkeypatch):  # fmt: skip
    import torch

    starts = []
    build = runs.build_trainer

    def spy(*args, **kwargs):
        trainer = build(*args, **kwargs)
        starts.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
        return trainer

    monkeypatch.setattr(runs, "build_trainer", spy)
    argv = ["compare", "--task", "reverse", "--output_dir", str(tmp_path), *TINY]
    assert main(argv) == 0
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG)
    for name in ("grpo", "gmpo"):
        rows = read_metrics(tmp_path / name / "seed0" / "metrics.jsonl")
        assert len(rows) == 2 and rows[0]["completions/max_length"] == 16
    # both methods of a seed start from the same warm-started model, warmed once
    assert len(starts) == 2 and starts[0].keys() == starts[1].keys()
    assert all(torch.equal(starts[0][k], starts[1][k]) for k in starts[0])
    out = capsys.readouterr().out
    assert out.count("warm start (seed 0)") == 1
    assert "task reverse; GRPO: loss_type='grpo'" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("where", ["argv", "config"])
def test_unknown_task_is_one_line(tmp_path, capsys, where):
    config = tmp_path / "run.yaml"
    config.write_text("task: palindrome\n")
    task = ["--task", "palindrome"] if where == "argv" else ["--config", str(config)]
    assert main(["compare", *task, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "palindrome" in err[0] and "reverse" in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_run_is_judged_for_collapse_from_40_logged_rewards():
    """run_summary applies gmpo_stats.collapse (tests/tasks/test_rules.py) to runs with at
    least 2 x 20 logged rewards, and says nothing of shorter ones."""

    def rows(curve):
        return [{"step": i + 1, "reward": r} for i, r in enumerate(curve)]

    s = run_summary(rows([0.1] * 20 + [0.9] * 20 + [0.5] * 20), 60)
    assert (s["reward_final"], s["reward_peak20"], s["collapsed"]) == (
        pytest.approx(0.5),
        pytest.approx(0.9),
        True,
    )
    assert run_summary(rows([0.5] * 20 + [0.2] * 20), 40)["collapsed"] is True  # exactly 0.3
    assert run_summary(rows([0.1] * 20 + [0.9] * 20 + [0.65] * 20), 60)["collapsed"] is False
    assert "collapsed" not in run_summary(rows([0.9] * 20 + [0.1] * 19), 39)


def test_compare_table_counts_collapsed_runs():
    runs_ = {
        "GRPO": [{"seed": 0, "reward_final": 0.0, "collapsed": True},
                 {"seed": 1, "reward_final": 0.2, "collapsed": False}],
        "GMPO": [{"seed": 0, "reward_final": 0.8, "collapsed": False},
                 {"seed": 1, "reward_final": 0.6, "collapsed": False}],
    }  # fmt: skip
    table, agg = compare_table(runs_)
    assert "| GRPO | 2 | 0.10 ± 0.14 | 1/2 |" in table and "| GMPO | 1 | 0.60 | no |" in table
    assert agg["GRPO"]["collapsed"]["count"] == 1 and "log-ratio min" not in table


def test_reverse_task_is_the_study_task():
    assert list(TASKS)[:3] == ["successor", "reverse", "add"]  # the first is the default
    prompts = ReverseTask().prompts(4, seed="train:0")
    assert TASKS["reverse"].dataset(0)["prompt"][:4] == prompts


# --------------------------------------------------------------------------------------------
# (CHANGELOG, 0.2): completion lengths the reverse model cannot hold, or that cannot score
# --------------------------------------------------------------------------------------------


class WarmStartRan(Exception):
    pass


@pytest.fixture
def no_warm_start(monkeypatch):
    """The warm start raises: what is checked before it never reaches it."""

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise WarmStartRan

    monkeypatch.setattr(warm_start, "warm_start_hf", refuse)
    monkeypatch.setattr(warm_start, "_WARM_STATES", {})


@pytest.mark.parametrize("command", ["train", "compare"])
def test_completion_past_the_models_positions_is_refused_before_the_warm_start(
    tmp_path, capsys, no_warm_start, command
):
    """Was an IndexError in generation after the ~37 s warm start (17 + 30 > 40 positions)."""
    argv = [command, "--task", "reverse", "--max_completion_length", "30",
            "--output_dir", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"gmpo {command}: error: --max_completion_length 30: the reverse task's prompt (17 "
        "tokens) and completion need 47 positions, its model has 40; give at most 23"
    ]
    assert not (tmp_path / "out").exists()


def test_longest_completion_the_model_holds_is_accepted(tmp_path, capsys, no_warm_start):
    argv = ["train", "--task", "reverse", "--max_completion_length", "23",
            "--output_dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(WarmStartRan):  # past the checks: the run starts
        main(argv)
    assert capsys.readouterr().err == ""


def test_completion_shorter_than_the_answer_warns_before_the_warm_start(tmp_path, capsys,
                                                                        no_warm_start):  # fmt: skip
    argv = ["train", "--task", "reverse", "--max_completion_length", "8",
            "--output_dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(WarmStartRan):
        main(argv)
    assert capsys.readouterr().err.strip().splitlines() == [
        "gmpo train: warning: --max_completion_length 8 is shorter than the reverse task's answer "
        "(16 tokens): no completion can earn its exact-match reward"
    ]


class _Built:
    """A trainer class that keeps the model ``build_trainer`` gives it (no training, no vLLM)."""

    def __init__(self, model, **_):
        self.model = model
        self.callback_handler = type("Handler", (), {"callbacks": []})()


@pytest.mark.parametrize("name", list(TINY_TASKS))
@pytest.mark.parametrize("use_vllm", [False, True])
def test_use_vllm_builds_the_task_model_with_heads_vllm_takes(
    tmp_path, short_warm_start, name, use_vllm
):
    """``--use_vllm`` without ``--model``: the built-in model with the task's ``vllm_heads``, each
    of 32 (the smallest head_dim vLLM's CPU attention takes); without it, its ``heads``."""
    if TASKS[name].requires is not None:  # a gym task's prompts are the gym's
        pytest.importorskip(TASKS[name].requires)
    script = type("Script", (), {"task": name, "reward": [], "dataset": None, "model": None})()
    config = type("Config", (), {"output_dir": str(tmp_path), "seed": 0, "use_vllm": use_vllm})()
    task = TASKS[name]
    plan = runs.Plan(script, config, task, (task.reward,), dataset=None, variant=None)
    model = runs.build_trainer(plan, config, _Built).model
    heads = model.config.num_attention_heads
    assert heads == (TASKS[name].vllm_heads if use_vllm else TASKS[name].heads)
    if use_vllm:
        assert model.config.hidden_size // heads == 32
