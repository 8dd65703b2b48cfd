"""The ``gmpo`` command: train (toy default, YAML, options), compare, and one-line errors."""

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
        (["train", "--config", "no_such.yaml"], "--config: no such file 'no_such.yaml'"),
        # issue 19, defect 6: these ended in a traceback and exit 1
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
        # issue 25, defect 3: a traceback and exit 1
        (["train", "--beta", "-1"], "beta must be a finite number >= 0, got -1.0"),
        (["compare", "--beta", "nan"], "beta must be a finite number >= 0, got nan"),
        # issue 25, defect 5: ran to exit 0 ("ratio clip [1 - nan, 1 + nan]")
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
        # issue 25, defect 12: YAML values of the wrong shape
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
    """Issue 19, defect 6: ``NotADirectoryError`` (traceback, exit 1) once the run tried to save."""
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
# help
# --------------------------------------------------------------------------------------------


def _help(command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``gmpo <command> --help`` in a fresh interpreter, failing if it imported the heavy stack."""
    code = (
        "import sys; from gmpo_trl.cli import main; rc = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'transformers', 'trl.trainer', 'datasets') "
        "if m in sys.modules]; "
        "assert not heavy, heavy; raise SystemExit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, command, "--help", *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("command", ["train", "compare"])
def test_help_is_short_and_imports_no_trl_trainer(command):
    proc = _help(command)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert len(text.splitlines()) < 120
    for option in ("--model", "--dataset", "--reward", "--output_dir", "--learning_rate",
                   "--max_steps", "--per_device_train_batch_size", "--num_generations",
                   "--bf16", "--use_cpu", "--epsilon", "--gmpo_lm_head", "--help-all"):  # fmt: skip
        assert option in text, option
    # a --model run's default first, the toy run's value marked as such
    assert "Default: 1e-06. [toy: 0.005]" in " ".join(text.split())
    assert ("--grpo_epsilon" in text) == ("--seeds" in text) == (command == "compare")


def test_help_defaults_are_gmpoconfigs():
    """What --help says a --model run gets is GMPOConfig's default (read without TRL)."""
    import dataclasses

    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.defaults import COMMON_TRL_OPTIONS
    from gmpo_trl.cli.help import short_help
    from gmpo_trl.fields import GMPO_FIELDS as OPTIONS

    declared = {f.name: f for f in dataclasses.fields(GMPOConfig)}
    for name, (_, default, _) in COMMON_TRL_OPTIONS.items():
        if default is not None:  # None: the help says what decides it
            assert declared[name].default == default, name
    # bf16 and use_cpu: decided at run time (test_no_accelerator_means_cpu)
    assert declared["bf16"].default is None and declared["use_cpu"].default is False
    text = " ".join(short_help("train").split())
    shown = [name for name, option in OPTIONS.items() if not option.fixed]
    assert shown == ["epsilon", "epsilon_high", "delta", "gmpo_impl", "gmpo_lm_head"]
    said = {"epsilon": " Default: 0.4.", "epsilon_high": "", "delta": "",
            "gmpo_impl": " Default: 'plain'.", "gmpo_lm_head": " Default: true."}  # fmt: skip
    for name in shown:  # GMPOConfig's help text and default, as --help shows them
        assert f"--{name} X {declared[name].metadata['help']}{said[name]}" in text, name
    assert declared["gmpo_lm_head"].default is True and declared["gmpo_impl"].default == "plain"
    assert "Default: 0.4. --epsilon_high" in text and "--loss_type" not in text


def test_help_all_lists_every_option(capsys):
    import dataclasses

    from gmpo_trl import GMPOConfig

    assert main(["train", "--help-all"]) == 0
    text = capsys.readouterr().out
    missing = [f.name for f in dataclasses.fields(GMPOConfig) if f"--{f.name}" not in text]
    assert missing == []


# --------------------------------------------------------------------------------------------
# a local model on CPU, no flags
# --------------------------------------------------------------------------------------------


def test_no_accelerator_means_cpu(tmp_path, capsys):
    """With --model and no GPU: use_cpu and no bf16 without a flag (GRPOConfig would refuse
    bf16 on a CPU); the run trains a local model directory."""
    from gmpo_tasks.chars import char_tokenizer
    from gmpo_tasks.models import qwen2_model
    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.defaults import has_accelerator
    from gmpo_trl.cli.parsing import parse

    if has_accelerator():
        pytest.skip("an accelerator is present")
    model_dir = tmp_path / "model"
    tokenizer = char_tokenizer()
    qwen2_model(tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = parse("train", ["--model", str(model_dir), "--output_dir", str(tmp_path)]).config(
        GMPOConfig
    )
    assert (config.use_cpu, config.bf16, config.learning_rate) == (True, False, 1e-6)
    config = parse("train", ["--model", str(model_dir), "--bf16", "true"]).config(GMPOConfig)
    assert config.bf16 is True  # the user's value wins
    out = tmp_path / "out"
    argv = ["train", "--model", str(model_dir), "--output_dir", str(out), "--max_steps", "2",
            "--max_completion_length", "2", "--logging_steps", "1", "--gmpo_impl", "plain"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert len(read_metrics(out / "metrics.jsonl")) == 2
    assert (out / "final" / "config.json").exists()


def test_summary_counts_optimizer_steps_not_logged_rows(tmp_path, capsys):
    argv = ["train", "--output_dir", str(tmp_path), "--max_steps", "5", "--logging_steps", "5"]
    assert main(argv) == 0
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 1
    assert "gmpo train: 5 optimizer steps (1 logged)" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# summaries and plots
# --------------------------------------------------------------------------------------------


def test_log_ratio_range_skips_on_policy_steps():
    from gmpo_trl.cli.reports import has_range, run_summary

    rows = [
        {"step": 1, "reward": 0.1, "log_ratio/min": 0.0, "log_ratio/max": 0.0},
        {"step": 2, "log_ratio/min": -0.5, "log_ratio/max": 0.25},
        {"step": 3, "log_ratio/min": -0.125, "log_ratio/max": 0.75},
        {"step": 4, "reward": 0.3, "log_ratio/min": 0.0, "log_ratio/max": 0.0},
    ]
    assert [has_range(r) for r in rows] == [False, True, True, False]
    s = run_summary(rows, global_step=8)
    assert (s["optimizer_steps"], s["logged_rows"], s["off_policy_rows"]) == (8, 4, 2)
    assert (s["log_ratio_min"], s["log_ratio_max"]) == (-0.5, 0.75)
    assert s["log_ratio_width_mean"] == (0.75 + 0.875) / 2
    assert (s["reward_first"], s["reward_final"], s["reward_window"]) == (0.1, 0.3, 1)


def _capture_figure(monkeypatch):
    import matplotlib.figure

    figures = []

    def savefig(fig, *args, **kwargs):  # type: ignore[no-untyped-def]
        figures.append(fig)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return figures


def test_training_plot_markers_clip_lines_and_clip_series(tmp_path, monkeypatch):
    from gmpo_trl.cli.plots import plot_training

    figures = _capture_figure(monkeypatch)
    rows = [{"step": 1, "reward": 0.5, "log_ratio/min": -0.3, "log_ratio/max": 0.2,
             "clip_ratio/low_mean": 0.1, "clip_ratio/high_mean": 0.0,
             "clip_ratio/region_mean": 0.1, "entropy": 2.0}]  # fmt: skip
    plot_training(rows, tmp_path / "p.png", bounds=(-0.4, 0.5))
    reward, ratio, clip, entropy = figures[0].axes
    for ax in (reward, entropy):  # one point is visible: a marker
        (line,) = ax.get_lines()
        assert line.get_marker() == "o" and len(line.get_xdata()) == 1
    dashed = sorted(ln.get_ydata()[0] for ln in ratio.get_lines() if ln.get_linestyle() == "--")
    assert dashed == [-0.4, 0.5]
    series = {ln.get_label(): ln for ln in clip.get_lines()}
    region, low = series["region (low + high)"], series["low_mean"]
    # region = low here: low stays visible, drawn thinner, on top, with its own marker and color
    assert list(region.get_ydata()) == list(low.get_ydata())
    assert low.get_zorder() >= region.get_zorder() and low.get_linewidth() < region.get_linewidth()
    assert low.get_marker() not in ("None", "", None) and low.get_color() != region.get_color()


def test_compare_plot_mean_and_spread(tmp_path, monkeypatch):
    from matplotlib.collections import PolyCollection

    from gmpo_trl.cli.plots import plot_compare

    figures = _capture_figure(monkeypatch)

    def run(shift):  # type: ignore[no-untyped-def]
        return [{"step": s, "reward": 0.1 * s + shift, "log_ratio/min": -s - shift,
                 "log_ratio/max": s + shift} for s in (1, 2, 3)]  # fmt: skip

    runs = {"GRPO": [run(0.0), run(0.2)], "GMPO": [run(0.0), run(0.4)]}
    plot_compare(runs, tmp_path / "c.png", {"GRPO": (-0.2, 0.18), "GMPO": (-0.4, 0.4)})
    reward_ax = figures[0].axes[0]
    means = {ln.get_label(): list(ln.get_ydata()) for ln in reward_ax.get_lines()}
    assert means["GMPO"] == pytest.approx([0.3, 0.4, 0.5])
    bands = [c for c in reward_ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2  # one spread band per method
    assert figures[0].axes[1].get_ylim() == figures[0].axes[2].get_ylim()  # shared y


# --------------------------------------------------------------------------------------------
# compare: seeds, options passed through
# --------------------------------------------------------------------------------------------


def _configs_parsed_twice(argv: list[str]) -> tuple[object, object]:
    """``gmpo compare``'s two configs as they were built before issue 22: argv parsed for
    GMPOConfig, then, without GMPOConfig's own options, parsed again for GRPOConfig, whose loss and
    clip were then set with ``setattr``. The oracle of the single parse."""
    import argparse
    import dataclasses

    from trl import GRPOConfig, TrlParser

    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.arguments import CompareArguments
    from gmpo_trl.cli.defaults import run_defaults

    probe = argparse.ArgumentParser(add_help=False)
    for name in ("--model", "--output_dir", "--grpo_epsilon"):
        probe.add_argument(name)
    known, _ = probe.parse_known_args(argv)

    def parse(argv: list[str], cls: type, forced: dict[str, object]) -> object:
        names = {f.name for f in dataclasses.fields(cls)}
        base = {**run_defaults("compare", model=known.model, output_dir=known.output_dir), **forced}
        parser = TrlParser((CompareArguments, cls))
        parser.set_defaults_with_config(**{k: v for k, v in base.items() if k in names})
        _, config = parser.parse_args_and_config(argv)
        for key, value in forced.items():
            setattr(config, key, value)
        return config

    gmpo_only = {f.name for f in dataclasses.fields(GMPOConfig)} - {
        f.name for f in dataclasses.fields(GRPOConfig)
    }
    grpo_argv, i = [], 0
    while i < len(argv):  # each GMPO-only option here has its value as the next word
        if argv[i][2:] in gmpo_only:
            i += 2
        else:
            grpo_argv.append(argv[i])
            i += 1
    eps = float(known.grpo_epsilon or 0.2)
    grpo = parse(grpo_argv, GRPOConfig, {"loss_type": "grpo", "epsilon": eps, "epsilon_high": None})
    return grpo, parse(argv, GMPOConfig, {})


def test_compare_parses_once_into_the_configs_it_built_parsing_twice(tmp_path):
    """Issue 22: one parse; GRPO's config from the options the user set. Both configs equal
    (``to_dict()``) the two-parse construction on each argument list."""
    from gmpo_trl.cli.compare import configs
    from gmpo_trl.cli.parsing import parse

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # parsing reads no model
    (tmp_path / "run.yaml").write_text("max_steps: 7\nepsilon: 0.25\ntemperature: 0.7\n")
    out = ["--output_dir", str(tmp_path / "out")]
    argv_lists = [
        [],
        ["--epsilon", "0.3", "--epsilon_high", "0.5", "--delta", "2.0", "--gmpo_impl", "compiled",
         "--gmpo_lm_head", "false", "--max_steps", "5", "--grpo_epsilon", "0.1", "--seed", "3"],
        ["--model", str(tmp_path / "model"), "--beta", "0.04", "--learning_rate", "1e-5",
         "--num_iterations", "3", "--use_vllm", "false", "--logging_steps", "2"],
        ["--config", str(tmp_path / "run.yaml"), "--max_steps", "9", "--seeds", "2"],
    ]  # fmt: skip
    for argv in argv_lists:
        grpo, gmpo = configs(parse("compare", [*argv, *out]))
        old_grpo, old_gmpo = _configs_parsed_twice([*argv, *out])
        assert type(grpo).__name__ == "GRPOConfig" and type(gmpo).__name__ == "GMPOConfig"
        assert grpo.to_dict() == old_grpo.to_dict(), argv
        assert gmpo.to_dict() == old_gmpo.to_dict(), argv
        assert (grpo.loss_type, gmpo.loss_type) == ("grpo", "gmpo")
    assert (grpo.max_steps, gmpo.max_steps, gmpo.epsilon, grpo.epsilon) == (9, 9, 0.25, 0.2)


def test_a_model_named_in_the_config_file_is_not_the_toy_run(tmp_path):
    """--model in the YAML file counts as --model: the toy run's settings (learning rate 5e-3,
    150 steps...) do not apply (before the single parse only the command line's --model did)."""
    from gmpo_trl.cli.parsing import parse

    (tmp_path / "run.yaml").write_text(f"model: {tmp_path}\nmax_steps: 4\n")
    toy = parse("train", ["--output_dir", str(tmp_path / "out")])
    named = parse("train", ["--config", str(tmp_path / "run.yaml"), "--output_dir", str(tmp_path)])
    assert toy.script.model is None and toy.defaults["learning_rate"] == 5e-3
    assert named.script.model == str(tmp_path) and "learning_rate" not in named.defaults
    assert named.values["max_steps"] == 4


def test_compare_gmpo_only_options_reach_gmpo_only(tmp_path):
    """``gmpo_impl`` and ``gmpo_lm_head`` (command line or YAML) configure GMPO; GRPO's config
    has no such fields and keeps GRPOConfig's own defaults for the fields GMPO redefines."""
    import dataclasses

    from trl import GRPOConfig

    from gmpo_trl.cli.compare import configs
    from gmpo_trl.cli.parsing import parse
    from gmpo_trl.fields import GMPO_FIELDS as OPTIONS

    (tmp_path / "run.yaml").write_text("gmpo_impl: compiled\n")
    argv = ["--config", str(tmp_path / "run.yaml"), "--gmpo_lm_head", "false", "--output_dir",
            str(tmp_path / "out")]  # fmt: skip
    grpo, gmpo = configs(parse("compare", argv))
    assert (gmpo.gmpo_impl, gmpo.gmpo_lm_head) == ("compiled", False)
    assert not any(hasattr(grpo, name) for name, o in OPTIONS.items() if o.added)
    grpo_defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert grpo.use_bias_correction_kl is grpo_defaults["use_bias_correction_kl"] is True
    assert (grpo.epsilon, grpo.epsilon_high, grpo.delta) == (0.2, None, None)


def test_compare_seeds_and_gmpo_options(tmp_path, capsys):
    argv = ["compare", "--output_dir", str(tmp_path), "--max_steps", "4", "--seeds", "2",
            "--gmpo_lm_head", "false", "--gmpo_impl", "plain"]  # fmt: skip
    assert main(argv) == 0
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG)
    for name in ("grpo", "gmpo"):
        for seed in (0, 1):
            rows = read_metrics(tmp_path / name / f"seed{seed}" / "metrics.jsonl")
            assert len(rows) == 4 and "log_ratio/max" in rows[-1]
            # num_iterations=2 by default: the second pass over each batch is off-policy
            assert max(r["log_ratio/max"] - r["log_ratio/min"] for r in rows) > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    finals = summary["aggregate"]["GMPO"]["reward_final"]
    assert len(finals["values"]) == 2
    assert finals["mean"] == pytest.approx(sum(finals["values"]) / 2)
    assert [r["seed"] for r in summary["runs"]["GRPO"]] == [0, 1]
    out = capsys.readouterr().out
    assert "| GMPO | 2 |" in out and " ± " in out
    assert "gmpo compare (GRPO, seed 1)" in out and "gmpo compare (GMPO, seed 1)" in out


# --------------------------------------------------------------------------------------------
# issue 25, defect 12: the paths that broke "one line, exit 2"
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
