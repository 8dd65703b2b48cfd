"""studies/stability: the group advantages, determinism of the warm start and the runs, and the
schema of a ``--quick`` run's summary.json (the rules: tests/tasks/test_rules.py; the methods:
tests/tasks/test_variants.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from studies.stability.run import Setup, group_advantages, rl_run, warm_start

ROOT = Path(__file__).resolve().parents[2]

RECORD_KEYS = {
    "method": str, "lr": float, "seed": int, "grad_clip": (float, type(None)),
    "final_reward": float, "peak_reward": float, "collapsed": bool, "max_grad_norm": float,
    "log_ratio_min": float, "log_ratio_max": float, "entropy_end": float, "cpu_s": float,
}  # fmt: skip


def test_group_advantages() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), 4)
    # group 1: mean 0.25, unbiased std 0.5 -> (0.75 / 0.5001, -0.25 / 0.5001); group 2 all 0
    assert adv[:4].tolist() == pytest.approx([0.75 / 0.5001] + [-0.25 / 0.5001] * 3)
    assert adv[4:].tolist() == [0.0] * 4


TINY = Setup(length=2, warm_steps=40, warm_batch=32, prompts=2, group=4, minibatches=2, steps=3)


def test_warm_start_and_runs_are_deterministic() -> None:
    torch.set_num_threads(1)
    a, b = warm_start(TINY, 0), warm_start(TINY, 0)
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    assert a["reward"] == b["reward"]
    other = warm_start(TINY, 1)
    assert not torch.equal(a["state"]["tok.weight"], other["state"]["tok.weight"])
    run = rl_run(TINY, a, "gmpo", 5e-3, 1.0, 0)
    assert run == rl_run(TINY, a, "gmpo", 5e-3, 1.0, 0)
    assert len(run["reward"]) == 3 and all(np.isfinite(v) for v in run["grad_norm"])
    # some group has mixed rewards, so the policy moves off the sampling policy, and another
    # method moves it differently from the same start
    assert 0 < max(run["reward"]) and max(run["log_ratio_max"]) > 1e-3
    assert run["log_ratio_max"] != rl_run(TINY, a, "grpo", 5e-3, 1.0, 0)["log_ratio_max"]


def test_quick_run_writes_the_summary_schema(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'adapters'}"}
    cmd = [sys.executable, "-m", "studies.stability", "--quick", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300, cwd=ROOT)
    records = json.loads((tmp_path / "summary.json").read_text())
    assert {(r["method"], r["seed"]) for r in records} == {
        (m, s) for m in ("grpo", "gmpo") for s in (0, 1)
    }
    for r in records:
        for key, kind in RECORD_KEYS.items():
            assert isinstance(r[key], kind), (key, r[key])
        assert r["log_ratio_min"] <= 0 <= r["log_ratio_max"] and r["cpu_s"] > 0
        assert r["peak_reward"] >= r["final_reward"]
        assert r["collapsed"] == (r["peak_reward"] - r["final_reward"] >= 0.3 - 1e-12)
    md = (tmp_path / "summary.md").read_text()
    for heading in ("## Collapsed runs", "## Sign tests", "one-sided p", "## Cost"):
        assert heading in md
    assert (tmp_path / "stability.png").stat().st_size > 10_000
    assert len((tmp_path / "curves.jsonl").read_text().splitlines()) == 4
    # a subset reruns from the cache: the same numbers, nothing recomputed
    sub = subprocess.run([*cmd, "--methods", "gmpo", "--seeds", "1"], check=True, env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again == [r for r in records if (r["method"], r["seed"]) == ("gmpo", 1)]
    assert "0 s CPU computed" in sub.stdout
