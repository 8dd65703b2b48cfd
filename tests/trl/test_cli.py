"""The ``gmpo`` command: train (toy default, YAML, options) and one-line errors (exit 2, no
traceback); help, summaries, plots and compare's configs are in test_cli_outputs.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("trl")

from gmpo_trl.cli import main
from gmpo_trl.cli.reports import read_metrics

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
    summary = json.loads((tmp_path / "summary.json").read_text())
    # step 1 is on-policy (a fresh generation: r = 0), steps 2 and 3 are not
    assert (summary["optimizer_steps"], summary["logged_rows"], summary["off_policy_rows"]) == (
        3,
        3,
        2,
    )
    assert "gmpo train: 3 optimizer steps (3 logged); reward" in capsys.readouterr().out


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
    monkeypatch.chdir(tmp_path)  # the command finds a reward module in the current directory
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{d}="}) + "\n" for d in range(8)))
    out = tmp_path / "out"
    argv = ["train", "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size",
            "16", "--reward", "my_rewards:always", "--dataset", str(data),
            "--num_iterations", "1", "--steps_per_generation", "1"]  # a reward every step  # fmt: skip
    assert main(argv) == 0
    assert [r["reward"] for r in read_metrics(out / "metrics.jsonl")] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["train", "--no_such_option", "1"], "unrecognized arguments: --no_such_option"),
        (["train", "--grpo_epsilon", "0.1"], "unrecognized arguments: --grpo_epsilon"),
        (["train", "--seeds", "3"], "unrecognized arguments: --seeds"),
        (["train", "--max_steps", "many"], "max_steps"),
        (["train", "--loss_type", "dapo"], "loss_type='dapo' has no meaning for GMPO"),
        (["train", "--epsilon", "-1"], "epsilon must be a finite number > 0 (a log-space bound), got -1.0"),
        (["train", "--reward", "nocolon"], "'nocolon': not module:function; give module:function"),
        (["train", "--reward", "json:nope"], "module json has no function 'nope'; give module:"),
        (["train", "--reward", "no_such_module_xyz:f"],
         "'no_such_module_xyz:f': no module 'no_such_module_xyz' found; give module:function, "
         "the module in the current directory or on PYTHONPATH"),
        (["train", "--dataset", "README.txt"], "not a .json/.jsonl/.csv/.parquet file; give a hub"),
        (["train", "--dataset", "/no/such/prompts.jsonl"],
         "--dataset '/no/such/prompts.jsonl': no such file or directory; give a hub id, a local "
         "directory, or a .json/.jsonl/.csv/.parquet file with a 'prompt' column"),
        (["train", "--dataset", "prompts.jsonl"], "--dataset 'prompts.jsonl': no such file"),
        (["train", "--model", "/nonexistent/model"],
         "--model '/nonexistent/model': no such directory; give a local model directory (with "
         "config.json, as save_pretrained writes it) or a hub id such as Qwen/Qwen2.5-Math-1.5B"),
        (["train", "--model", "./models/mine"], "--model './models/mine': no such directory"),
        (["train", "--model", "a/b/c"], "--model 'a/b/c': no such directory"),
        (["train", "--model", "README.txt"], "'README.txt': not a model directory (no config.json)"),
        (["compare", "--model", "/nonexistent/model"], "--model '/nonexistent/model': no such"),
        (["compare", "--seeds", "0"], "--seeds must be at least 1, got 0"),
        # trained the first seed, then failed on the second with NumPy's range error
        (["compare", "--seed", "4294967295", "--seeds", "2", "--max_steps", "1"],
         "--seed 4294967295 with --seeds 2 runs seeds 4294967295 to 4294967296: a seed must be "
         "an integer from 0 to 4294967295"),
        # refused by NumPy once the trainer was built, its output directory made
        (["train", "--seed", "-1"], "--seed -1: a seed must be an integer from 0 to 4294967295"),
        (["compare", "--seed", "4294967296"], "--seed 4294967296: a seed must be an integer"),
        (["train", "--config", "no_such.yaml"], "--config: no such file 'no_such.yaml'"),
        # (CHANGELOG, 0.2): these ended in a traceback and exit 1
        (["train", "--config", "bad.yaml"],
         "--config 'bad.yaml': not valid YAML: expected ',' or ']', but got ':' (line 2, "
         "column 8)"),
        (["train", "--config", "."], "--config '.': Is a directory"),
        (["train", "--per_device_train_batch_size", "0"],
         "--per_device_train_batch_size must be an integer >= 1, got 0"),
        (["train", "--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps must be"),
        (["train", "--num_generations", "0"], "--num_generations must be an integer >= 1, got 0"),
        (["train", "--steps_per_generation", "0"], "--steps_per_generation must be"),
        (["train", "--num_iterations", "0"], "--num_iterations must be an integer >= 1, got 0"),
        (["train", "--learning_rate", "-1"], "--learning_rate must be a finite number >= 0, got"),
        (["compare", "--per_device_train_batch_size", "0"], "--per_device_train_batch_size must"),
        # (CHANGELOG, 0.2): a traceback and exit 1
        (["train", "--beta", "-1"], "beta must be a finite number >= 0, got -1.0"),
        (["compare", "--beta", "nan"], "beta must be a finite number >= 0, got nan"),
        # (CHANGELOG, 0.2): ran to exit 0 ("ratio clip [1 - nan, 1 + nan]")
        (["compare", "--grpo_epsilon", "nan"],
         "--grpo_epsilon must be a finite number in (0, 1) (GRPO's ratio clip [1 - eps, 1 + eps]),"
         " got nan"),
        (["compare", "--grpo_epsilon", "-0.5"], "--grpo_epsilon must be a finite number in (0, 1)"),
        (["compare", "--grpo_epsilon", "0"], "--grpo_epsilon must be a finite number in (0, 1)"),
        (["compare", "--grpo_epsilon", "1"], "--grpo_epsilon must be a finite number in (0, 1)"),
        (["compare", "--grpo_epsilon", "inf"], "--grpo_epsilon must be a finite number in (0, 1)"),
        # gmpo compare ignored it (trained from step 1)
        (["compare", "--resume_from_checkpoint", "true"],
         "--resume_from_checkpoint: gmpo compare does not resume"),
        # (CHANGELOG, Unreleased): a loss variant that does not resolve, or a setting it would drop
        (["compare", "--variant", "nope"], "loss_variant: unknown variant 'nope': choose from"),
        (["train", "--loss_variant", "no_such_module_xyz:f"],
         "loss_variant: variant 'no_such_module_xyz:f': no module 'no_such_module_xyz' found"),
        (["compare", "--variant", "gmpo_narrow", "--beta", "0.04"],
         "beta=0.04 does not apply to loss_variant='gmpo_narrow': a variant has no KL term"),
        # (CHANGELOG, 0.2): YAML values of the wrong shape
        (["train", "--config", "list.yaml"],
         "--config 'list.yaml': --max_steps must be one int, got [1, 2]"),
        (["train", "--config", "float.yaml"],
         "--config 'float.yaml': --max_steps must be one int, got 1.5"),
        (["train", "--config", "bool.yaml"],
         "--config 'bool.yaml': --learning_rate must be one float, got True"),
        (["train", "--config", "reward.yaml"],
         "--reward 'no_such_module_xyz:f': no module 'no_such_module_xyz' found"),
    ],
)  # fmt: skip
def test_bad_arguments_get_one_line(tmp_path, capsys, monkeypatch, argv, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.txt").write_text("x")
    (tmp_path / "bad.yaml").write_text("max_steps: [1\nepsilon: 0.3\n")  # an unclosed list
    (tmp_path / "list.yaml").write_text("max_steps: [1, 2]\n")
    (tmp_path / "float.yaml").write_text("max_steps: 1.5\n")
    (tmp_path / "bool.yaml").write_text("learning_rate: true\n")
    (tmp_path / "reward.yaml").write_text("reward: no_such_module_xyz:f\n")  # one, not a list
    assert main([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gmpo") and match in err[0], err
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("command", ["train", "compare"])
@pytest.mark.parametrize("below", ["", "out"])
def test_output_dir_at_or_below_a_file_is_refused_before_training(tmp_path, capsys, command, below):
    """(CHANGELOG, 0.2): ``NotADirectoryError`` (traceback, exit 1) once the run tried to save."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = blocker / below if below else blocker
    assert main([command, "--output_dir", str(out), "--max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"gmpo {command}: error: --output_dir {str(out)!r}: {str(blocker)!r} is a file, "
        "not a directory"
    ]
    assert blocker.read_text() == "x"


def test_console_script_error_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gmpo_trl.cli", "train", "--delta", "0.5", "--output_dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gmpo")]
    assert lines == [
        "gmpo train: error: delta must be a finite number > 1 (a cap on the ratio for negative "
        "advantages), got 0.5"
    ]
    assert "Traceback" not in proc.stderr


def test_use_vllm_without_vllm_is_one_line(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed")
    assert main(["train", "--use_vllm", "true", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vLLM is not available" in err[0]


# --------------------------------------------------------------------------------------------
# (CHANGELOG, 0.2): the paths that broke "one line, exit 2"
# --------------------------------------------------------------------------------------------


def test_yaml_values_are_typed_like_the_command_line(tmp_path):
    """A scalar for a list option is a list of one (it was split into characters), and a YAML
    number for a float option is the float the command line would give."""
    from gmpo_trl.cli.parsing import parse

    config = tmp_path / "run.yaml"
    config.write_text("reward: json:dumps\nlearning_rate: 1\nreward_weights: 2\n")
    parsed = parse("train", ["--config", str(config), "--output_dir", str(tmp_path)])
    assert parsed.script.reward == ["json:dumps"]
    lr = parsed.values["learning_rate"]
    assert lr == 1.0 and isinstance(lr, float)
    assert parsed.values["reward_weights"] == [2.0]
    config.write_text("reward: [json:dumps, json:loads]\nreport_to: [tensorboard]\n")
    parsed = parse("train", ["--config", str(config), "--output_dir", str(tmp_path)])
    assert parsed.script.reward == ["json:dumps", "json:loads"]
    assert parsed.values["report_to"] == ["tensorboard"]  # a list is a valid report_to


def _unwritable_for_root() -> str:
    """A directory no process can create files in, root included (sysfs refuses new files)."""
    import tempfile
    from pathlib import Path

    if not Path("/sys/kernel").is_dir():
        pytest.skip("needs Linux's /sys")
    with pytest.raises(OSError):  # the premise: this user really cannot write there
        tempfile.TemporaryFile(dir="/sys/kernel")
    return "/sys/kernel"


@pytest.mark.parametrize("command", ["train", "compare"])
@pytest.mark.parametrize("below", ["", "gmpo_cli_test_out"])
def test_unwritable_output_dir_is_refused_before_training(capsys, command, below):
    """Was a ``PermissionError`` traceback once the run saved its first file."""
    base = _unwritable_for_root()
    out = f"{base}/{below}" if below else base
    assert main([command, "--output_dir", out, "--max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gmpo {command}: error: --output_dir {out!r}: "
                                               f"cannot create files in {base!r}"), err  # fmt: skip


def test_report_to_an_integration_that_is_not_installed_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    assert main(["train", "--report_to", "wandb", "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "gmpo train: error: --report_to wandb: wandb is not installed (pip install wandb), or "
        "leave it out of --report_to"
    ]
    assert not (tmp_path / "out").exists()


def test_report_to_any_integration_that_is_not_installed_is_one_line(tmp_path, capsys,
                                                                     monkeypatch):  # fmt: skip
    import transformers.integrations

    monkeypatch.setattr(transformers.integrations, "get_available_reporting_integrations", list)
    argv = ["train", "--report_to", "tensorboard", "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gmpo train: error: --report_to tensorboard: not installed (pip install tensorboard), or "
        "leave it out of --report_to"
    ]


def test_report_to_wandb_without_a_login_is_one_line(tmp_path):
    """Installed or not, ``--report_to wandb`` with no API key is refused before any work (it was
    wandb's UsageError traceback at the start of training)."""
    import importlib.util
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"),
               WANDB_DIR=str(tmp_path), NETRC=str(tmp_path / "no_netrc"))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "gmpo_trl.cli", "train", "--report_to", "wandb", "--max_steps",
         "1", "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gmpo")]
    if importlib.util.find_spec("wandb") is None:
        expected = "gmpo train: error: --report_to wandb: wandb is not installed"
    else:
        expected = "gmpo train: error: --report_to wandb: not logged in (No API key configured."
    assert len(lines) == 1 and lines[0].startswith(expected), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["train", "compare"])
def test_ctrl_c_writes_the_summary_of_the_steps_done_and_exits_130(tmp_path, capsys, monkeypatch,
                                                                    command):  # fmt: skip
    """A KeyboardInterrupt at step 2 (from a callback, as the Trainer sees Ctrl-C): was a
    traceback with no summary or plot."""
    from transformers import TrainerCallback

    import gmpo_trl

    class CtrlC(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step == 2:
                raise KeyboardInterrupt

    class Interrupted(gmpo_trl.GMPOTrainer):  # type: ignore[misc]
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            self.add_callback(CtrlC())

    monkeypatch.setattr(gmpo_trl, "GMPOTrainer", Interrupted)
    argv = [command, "--output_dir", str(tmp_path), "--max_steps", "4", "--logging_steps", "1"]
    assert main(argv) == 130
    run_dir = tmp_path / "gmpo" / "seed0" if command == "compare" else tmp_path
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["optimizer_steps"] == 2
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1]  # logged after
    assert (run_dir / "metrics.png").read_bytes().startswith(PNG)
    assert "2 optimizer steps" in (run_dir / "summary.md").read_text()
    assert not (tmp_path / "final").exists()  # an interrupted run's model is not "final"
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"gmpo {command}: interrupted after 2 of 4 optimizer steps; the summary and "
                       f"plot of the steps done are in {run_dir}")  # fmt: skip


def test_help_into_a_closed_pipe_exits_quietly():
    """``gmpo train --help | head``: was a BrokenPipeError traceback once the reader had gone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gmpo_trl.cli", "train", "--help"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    proc.stdout.close()  # the reader leaves before the help is written
    _, err = proc.communicate(timeout=120)
    assert err.decode() == ""
    assert proc.returncode == 141  # 128 + SIGPIPE, as a process that SIGPIPE ended
