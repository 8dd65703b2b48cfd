"""``gmpo train`` on the real model: ``--model smollm2-135m`` or a chat task names it, a run gets
a pretrained model's defaults and the task's settings, the held-out reward before and after, and
the one-line errors where a model or option does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmpo_trl.cli import main
from gmpo_trl.cli.defaults import MODEL_DEFAULTS
from gmpo_trl.cli.reports import read_metrics

pytest.importorskip("reasoning_gym")


def _config(command: str, argv: list[str]):
    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.parsing import parse

    parsed = parse(command, argv)
    return parsed.script, parsed.config(GMPOConfig)


@pytest.mark.parametrize("command", ["train", "compare"])
def test_a_chat_task_brings_its_model_and_settings(command: str, tmp_path: Path) -> None:
    from gmpo_tasks.catalog import TASKS

    cell = TASKS["chat_chain_sum"].settings
    for argv in (["--task", "chat_chain_sum"], ["--model", "smollm2-135m"]):
        script, config = _config(command, [*argv, "--output_dir", str(tmp_path)])
        assert script.task == "chat_chain_sum"  # --model without --task: the first chat task
        assert config.num_iterations == cell.epochs == MODEL_DEFAULTS["num_iterations"] == 2
        assert (config.learning_rate, config.temperature) == (cell.lr, cell.temperature)
        assert config.per_device_train_batch_size == cell.prompts * cell.group // cell.minibatches
        assert (config.num_generations, config.max_completion_length) == (8, 32)
        assert config.max_steps == cell.generations * cell.minibatches * cell.epochs
        assert (config.logging_steps, config.save_strategy) == (1, "no")
        assert config.use_cpu  # no accelerator here: the CPU's defaults, not the toy task's


def test_a_chat_task_on_a_model_without_a_chat_template(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    assert main(["train", "--model", str(model), "--output_dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gmpo train: error: --model {str(model)!r}: the chat_chain_sum task's prompts are chat "
        "messages, and this model has no chat template; give a chat model, --dataset with plain "
        "prompts, or --task successor (the toy task)"
    )


def test_format_reward_is_a_chat_tasks(tmp_path: Path, capsys) -> None:
    assert main(["train", "--format_reward", "true", "--output_dir", str(tmp_path)]) == 2
    assert (
        "--format_reward is a chat task's answer format, on its own prompts: give --task "
        "chat_chain_sum or chat_spell_backward or chat_arith without --dataset"
        in capsys.readouterr().err
    )


def test_the_real_model_trains_and_is_scored_before_and_after(tmp_path: Path, capsys) -> None:
    """Two optimizer steps on one generation (num_iterations 2: the second is off-policy), the
    held-out reward of the untrained and the trained model, no checkpoint; CI's smallest run."""
    out = tmp_path / "run"
    argv = ["train", "--task", "chat_chain_sum", "--output_dir", str(out), "--max_steps", "2",
            "--per_device_train_batch_size", "4", "--num_generations", "2",
            "--max_completion_length", "6", "--held_out", "1", "--format_reward", "true",
            "--seed", "1"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # the seed's first generation has rewards that differ (at seed 0, since the held-out split
    # became disjoint, both of its groups score 0 alike: no advantage, no update to see)
    assert rows[0]["reward_std"] > 0
    assert rows[0]["log_ratio/max"] == rows[0]["log_ratio/min"] == 0.0  # on-policy
    assert rows[1]["log_ratio/max"] > rows[1]["log_ratio/min"]  # the second pass: off-policy
    assert {"rewards/reward/mean", "rewards/format_reward/mean"} <= set(rows[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["held_out_completions"] == 4 and summary["off_policy_rows"] == 1
    for key in ("held_out_reward_before", "held_out_reward_after", "held_out_right_after"):
        assert 0.0 <= summary[key] <= 1.0, key
    assert not list(out.glob("checkpoint-*"))  # save_strategy "no"
    config = json.loads((out / "final" / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"]) == ("llama", 49152)
    assert "held-out reward" in capsys.readouterr().out
