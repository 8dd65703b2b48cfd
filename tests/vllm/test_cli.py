"""``gmpo train --use_vllm true`` and both sides of ``gmpo compare --use_vllm true`` train on the
CPU as written (the built-in toy model at head_dim 32, the workaround applied and said once)."""

from __future__ import annotations

import pytest

from gmpo_trl.cli import main
from gmpo_trl.cli.reports import read_metrics
from tests.vllm import _support  # noqa: F401  (skips this module where vLLM is not installed)

pytestmark = pytest.mark.vllm

#: logged by TRL only where vLLM generated (its sampling log-probs against the trainer's)
VLLM_KEY = "sampling/sampling_logp_difference/max"
QUICK = ["--use_vllm", "true", "--max_steps", "2", "--per_device_train_batch_size", "16"]


def test_train_with_vllm(tmp_path):
    assert main(["train", "--output_dir", str(tmp_path), *QUICK]) == 0
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert VLLM_KEY in rows[0]
    assert (tmp_path / "final" / "config.json").exists()


def test_compare_with_vllm_both_sides(tmp_path):
    assert main(["compare", "--output_dir", str(tmp_path), *QUICK]) == 0
    for side in ("grpo", "gmpo"):
        (run,) = (tmp_path / side).glob("seed*")
        rows = read_metrics(run / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2] and VLLM_KEY in rows[0], side
    assert (tmp_path / "summary.md").exists()
