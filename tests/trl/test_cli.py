"""The ``gmpo`` command: train (toy default, YAML, options), compare, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("trl")

from gmpo_trl.cli import main, read_metrics

pytestmark = pytest.mark.trl

PNG = b"\x89PNG\r\n\x1a\n"


def test_train_toy_default(tmp_path, capsys):
    assert main(["train", "--output_dir", str(tmp_path), "--max_steps", "3"]) == 0
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("reward", "log_ratio/min", "log_ratio/max", "clip_ratio/region_mean", "entropy"):
        assert key in rows[0]
    assert (tmp_path / "metrics.png").read_bytes().startswith(PNG)
    assert (tmp_path / "final" / "config.json").exists()
    assert "gmpo train: 3 steps; reward" in capsys.readouterr().out


def test_yaml_config_and_command_line_precedence(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 2\nepsilon: 0.3\nnum_iterations: 2\n")
    out = tmp_path / "out"
    assert main(["train", "--config", str(config), "--output_dir", str(out)]) == 0
    assert len(read_metrics(out / "metrics.jsonl")) == 2
    assert (
        main(["train", "--config", str(config), "--output_dir", str(out), "--max_steps", "1"]) == 0
    )
    assert len(read_metrics(out / "metrics.jsonl")) == 1


def test_reward_and_dataset_options(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def always(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{d}="}) + "\n" for d in range(8)))
    out = tmp_path / "out"
    argv = ["train", "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size",
            "16", "--reward", "my_rewards:always", "--dataset", str(data),
            "--num_iterations", "1", "--steps_per_generation", "1"]  # a reward every step  # fmt: skip
    assert main(argv) == 0
    assert [r["reward"] for r in read_metrics(out / "metrics.jsonl")] == [1.0, 1.0]


def test_compare(tmp_path, capsys):
    assert main(["compare", "--output_dir", str(tmp_path), "--max_steps", "4"]) == 0
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG)
    for name in ("grpo", "gmpo"):
        rows = read_metrics(tmp_path / name / "metrics.jsonl")
        assert len(rows) == 4 and "log_ratio/max" in rows[-1]
        # num_iterations=2 by default: the second pass over each batch is off-policy
        assert max(r["log_ratio/max"] - r["log_ratio/min"] for r in rows) > 0
    out = capsys.readouterr().out
    assert "gmpo compare (GRPO)" in out and "gmpo compare (GMPO)" in out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["train", "--no_such_option", "1"], "unrecognized arguments: --no_such_option"),
        (["train", "--max_steps", "many"], "max_steps"),
        (["train", "--loss_type", "dapo"], "loss_type='dapo' has no meaning for GMPO"),
        (["train", "--epsilon", "-1"], "epsilon must be a finite log-space bound > 0"),
        (["train", "--reward", "nocolon"], "expected module:function"),
        (["train", "--reward", "json:nope"], "json has no function 'nope'"),
        (["train", "--reward", "no_such_module_xyz:f"], "cannot import"),
        (["train", "--dataset", "README.txt"], "--dataset"),
    ],
)
def test_bad_arguments_get_one_line(tmp_path, capsys, argv, match):
    if argv[-1] == "README.txt":
        (tmp_path / "README.txt").write_text("x")
        argv = [*argv[:-1], str(tmp_path / "README.txt")]
    assert main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gmpo") and match in err[0], err


def test_console_script_error_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gmpo_trl.cli", "train", "--delta", "0.5", "--output_dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gmpo")]
    assert lines == [
        "gmpo train: error: delta (GMPO's dual clip) must be a finite ratio cap > 1, got 0.5"
    ]
    assert "Traceback" not in proc.stderr


def test_use_vllm_without_vllm_is_one_line(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed")
    assert main(["train", "--use_vllm", "true", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vLLM is not available" in err[0]
