"""A reasoning-gym task through the ``gmpo`` command: ``gmpo train --task chain_sum`` (answers of
varying length; a 3-step warm start, 2 optimizer steps) scores with the gym's entries that the
dataset's ``entry`` column carries, and without reasoning_gym ``gmpo train`` and ``gmpo
compare`` refuse a gym task in one line naming the extra."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

pytest.importorskip("trl")

from gmpo_tasks import warm_start
from gmpo_tasks.catalog import TASKS
from gmpo_tasks.chain_sum import ChainSumTask
from gmpo_tasks.warm_start import WarmStart
from gmpo_trl.cli import main
from gmpo_trl.cli.reports import read_metrics

pytestmark = pytest.mark.trl


def test_train_chain_sum_scores_with_the_gyms_entries(tmp_path, capsys, monkeypatch):
    pytest.importorskip("reasoning_gym")
    monkeypatch.setitem(TASKS, "chain_sum",
                        dataclasses.replace(TASKS["chain_sum"], warm=WarmStart(steps=3)))  # fmt: skip
    monkeypatch.setattr(warm_start, "_WARM_STATES", {})
    seen: list[tuple[list[str], list[str], list[str] | None]] = []
    reward = ChainSumTask.reward

    def spy(self, prompts, completions, entry=None, **kw):
        seen.append((list(prompts), list(completions), entry and list(entry)))
        return reward(self, prompts, completions, entry=entry, **kw)

    spy.__name__ = "reward"
    monkeypatch.setattr(ChainSumTask, "reward", spy)
    argv = ["train", "--task", "chain_sum", "--output_dir", str(tmp_path), "--max_steps", "2",
            "--logging_steps", "1"]  # fmt: skip
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # 16 prompts x 8 completions of at most 3 characters and the end-of-sequence token
    assert rows[0]["completions/max_length"] <= 4 and 0.0 <= rows[0]["reward"] <= 1.0
    # the warm start's sampled reward (256 held-out prompts, no column), then TRL's batch
    assert [(len(p), e is None) for p, _, e in seen] == [(256, True), (128, False)]
    prompts, completions, entries = seen[1]
    assert entries is not None
    task = TASKS["chain_sum"]
    assert all(task.compact(json.loads(e)) == p for p, e in zip(prompts, entries, strict=True))
    # TRL passes a completion without the end-of-sequence token whole; the reward reads 3
    assert all(len(c) <= 4 for c in completions)
    assert task.reward(prompts, completions) == task.reward(prompts, [c[:3] for c in completions])
    assert "warm start (seed 0): 3 supervised steps" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["train", "compare"])
def test_refused_in_one_line_without_reasoning_gym(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` fails
    out = tmp_path / "out"
    assert main([command, "--task", "countdown", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gmpo {command}: error: "), err
    assert "countdown" in err[0] and "pip install -e '.[gym]'" in err[0], err
    assert not out.exists()
