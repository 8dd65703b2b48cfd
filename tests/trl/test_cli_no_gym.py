"""Without the gym extra (CHANGELOG, Unreleased): a user's own model, dataset and reward plan a
run with the `trl` extra alone, and a missing path is named before any task's extra is asked."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("trl")

from gmpo_trl.cli import main
from tests.trl.test_cli_upfront import _REWARDS, _data, _model_dir

pytestmark = pytest.mark.trl


def _no_gym(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # find_spec: None; import: fails


def test_a_missing_model_path_is_named_without_reasoning_gym(monkeypatch, capsys):
    """Before: 'the chat_chain_sum task needs reasoning-gym' (the default task's extra was
    checked before the path)."""
    _no_gym(monkeypatch)
    assert main(["train", "--model", "/no/such/model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "gmpo train: error: --model '/no/such/model': no such directory"
    )


def test_own_model_dataset_and_reward_plan_without_reasoning_gym(tmp_path, monkeypatch):
    """A user's model, dataset and reward use no task, whichever --task names: a plan without
    reasoning-gym (before: --task chain_sum was refused for its extra, unused)."""
    from gmpo_trl.cli.parsing import parse
    from gmpo_trl.cli.runs import build_plan

    _no_gym(monkeypatch)
    (tmp_path / "myrewards.py").write_text(_REWARDS)
    monkeypatch.chdir(tmp_path)
    data = _data(tmp_path, [{"prompt": "1+1=", "answer": "2"}])
    model = _model_dir(tmp_path)
    for task in ([], ["--task", "chain_sum"]):
        argv = ["--model", str(model), "--dataset", str(data), "--reward",
                "myrewards:needs_answer", "--output_dir", str(tmp_path / "o"), *task]  # fmt: skip
        plan = build_plan(parse("train", argv))
        assert plan.model == str(model)
        assert plan.dataset.column_names == ["prompt", "answer"]
    assert "reasoning_gym" not in {m for m, v in sys.modules.items() if v is not None}
