"""The ``gmpo`` command's outputs: ``--help``, the CPU default, the summaries and plots of a
run, and ``gmpo compare``'s configs and seeds."""

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
    assert len(text.splitlines()) < 130
    for option in ("--model", "--dataset", "--reward", "--output_dir", "--learning_rate",
                   "--max_steps", "--per_device_train_batch_size", "--num_generations",
                   "--bf16", "--use_cpu", "--epsilon", "--gmpo_lm_head", "--help-all"):  # fmt: skip
        assert option in text, option
    # a --model run's default first (the chat task's), then with --dataset, then the toy run's
    assert "Default: 2e-05. [--dataset: 1e-05] [toy: 0.005]" in " ".join(text.split())
    assert "--save_strategy S" in text and "Default: 'no'." in " ".join(text.split())
    assert ("--grpo_epsilon" in text) == ("--seeds" in text) == (command == "compare")


def test_help_defaults_are_gmpoconfigs(tmp_path):
    """What --help says a --model run gets is GMPOConfig's default, or a pretrained model's
    (MODEL_DEFAULTS: what a run on a pretrained model gets instead), read without TRL; and it is
    what a --model run's config holds."""
    import dataclasses

    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.defaults import COMMON_TRL_OPTIONS, MODEL_DEFAULTS
    from gmpo_trl.cli.help import short_help
    from gmpo_trl.cli.parsing import parse
    from gmpo_trl.fields import GMPO_FIELDS

    declared = {f.name: f for f in dataclasses.fields(GMPOConfig)}
    assert set(MODEL_DEFAULTS) <= set(COMMON_TRL_OPTIONS)  # each shown by --help
    local = tmp_path  # a model directory and a data file: checked up front
    (local / "config.json").write_text("{}")
    (local / "d.jsonl").write_text('{"prompt": "1 2"}\n')
    argv = ["--model", str(local), "--dataset", str(local / "d.jsonl"), "--output_dir", "x"]
    for command in ("train", "compare"):  # the two commands share them
        run = parse(command, argv).config(GMPOConfig)
        for name, (_, default, _) in COMMON_TRL_OPTIONS.items():
            if default is not None and name != "output_dir":
                want = MODEL_DEFAULTS.get(name, declared[name].default)
                assert default == want, name
                assert getattr(run, name) == default, (command, name)
    # bf16 and use_cpu: decided at run time (test_no_accelerator_means_cpu)
    assert declared["bf16"].default is None and declared["use_cpu"].default is None
    text = " ".join(short_help("train").split())
    shown = [name for name, option in GMPO_FIELDS.items() if option.brief and not option.fixed]
    assert shown == ["epsilon", "epsilon_high", "delta", "gmpo_impl", "gmpo_lm_head",
                     "loss_variant"]  # fmt: skip
    said = {"epsilon": " Default: 0.4.", "epsilon_high": "", "delta": "",
            "gmpo_impl": " Default: 'plain'.", "gmpo_lm_head": "",
            "loss_variant": ""}  # fmt: skip
    for name in shown:  # GMPOConfig's help text and default, as --help shows them
        assert f"--{name} X {declared[name].metadata['help']}{said[name]}" in text, name
    assert declared["gmpo_lm_head"].default is None and declared["gmpo_impl"].default == "plain"
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
    toy = ["--model", str(model_dir), "--task", "successor"]  # a character model: no chat
    config = parse("train", [*toy, "--output_dir", str(tmp_path)]).config(GMPOConfig)
    assert (config.use_cpu, config.bf16, config.learning_rate) == (True, False, 1e-5)
    config = parse("train", [*toy, "--bf16", "true"]).config(GMPOConfig)
    assert config.bf16 is True  # the user's value wins
    out = tmp_path / "out"
    argv = ["train", *toy, "--output_dir", str(out), "--max_steps", "2",
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
    # the first logged reward, and gmpo_stats.outcome's final: the mean of the last 20 (all 2)
    assert (s["reward_first"], s["reward_final"], s["reward_window"]) == (0.1, 0.2, 2)


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
    """``gmpo compare``'s two configs as they were built before it parsed once (CHANGELOG, 0.2):
    argv parsed for GMPOConfig, then, without GMPOConfig's own options, parsed again for
    GRPOConfig, whose loss and clip were then set with ``setattr``. The oracle of the single
    parse."""
    import argparse
    import dataclasses

    from trl import GRPOConfig, TrlParser

    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.arguments import CompareArguments
    from gmpo_trl.cli.defaults import run_defaults

    probe = argparse.ArgumentParser(add_help=False)
    for name in ("--model", "--output_dir", "--grpo_epsilon", "--task"):
        probe.add_argument(name)
    known, _ = probe.parse_known_args(argv)

    def parse(argv: list[str], cls: type, forced: dict[str, object]) -> object:
        names = {f.name for f in dataclasses.fields(cls)}
        base = {**run_defaults("compare", model=known.model, output_dir=known.output_dir,
                               task=known.task), **forced}  # fmt: skip
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
    """(CHANGELOG, 0.2): one parse; GRPO's config from the options the user set. Both configs equal
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
        ["--model", str(tmp_path / "model"), "--task", "successor", "--beta", "0.04",
         "--learning_rate", "1e-5", "--num_iterations", "3", "--use_vllm", "false",
         "--logging_steps", "2"],
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
    150 steps...) do not apply (before the single parse only the command line's --model did);
    the first chat task's do, as with --model on the command line."""
    pytest.importorskip("reasoning_gym")  # --model alone: the chat task, a gym task
    from gmpo_tasks.catalog import TASKS
    from gmpo_trl.cli.parsing import parse

    (tmp_path / "run.yaml").write_text(f"model: {tmp_path}\nmax_steps: 4\n")
    (tmp_path / "config.json").write_text("{}")  # a model directory, checked up front
    toy = parse("train", ["--output_dir", str(tmp_path / "out")])
    named = parse("train", ["--config", str(tmp_path / "run.yaml"), "--output_dir", str(tmp_path)])
    assert toy.script.model is None and toy.defaults["learning_rate"] == 5e-3
    assert named.script.model == str(tmp_path) and named.script.task == "chat_chain_sum"
    assert named.defaults["learning_rate"] == TASKS["chat_chain_sum"].settings.lr
    assert named.values["max_steps"] == 4


def test_own_model_dataset_and_reward_need_no_reasoning_gym(tmp_path, monkeypatch, capsys):
    """--model with --dataset and --reward trains the user's data: the default task is not the
    chat task (which needs reasoning-gym), so a machine without reasoning-gym runs it (before,
    every --model run without --task defaulted to chat_chain_sum and was refused there). Without
    --dataset the chat task is the default, and its refusal says why it was chosen."""
    import importlib.util

    from gmpo_trl.cli.parsing import parse

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "reasoning_gym" else real_find_spec(name, *a),
    )
    (tmp_path / "d.jsonl").write_text('{"prompt": "1 2"}\n')
    (tmp_path / "config.json").write_text("{}")  # a model directory, as far as the path goes
    own = ["--model", str(tmp_path), "--dataset", str(tmp_path / "d.jsonl"),
           "--output_dir", str(tmp_path / "out")]  # fmt: skip
    assert parse("train", own).script.task == "successor"
    assert main(["train", "--model", str(tmp_path), "--output_dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "gmpo train: error: the chat_chain_sum task needs reasoning-gym, which is not installed: "
        "pip install -e '.[gym]' in the gmpo clone (--model without --task or --dataset trains "
        "the chat_chain_sum task; give --task or --dataset and --reward for another)"
    ]


def test_compare_gmpo_only_options_reach_gmpo_only(tmp_path):
    """``gmpo_impl`` and ``gmpo_lm_head`` (command line or YAML) configure GMPO; GRPO's config
    has no such fields and keeps GRPOConfig's own defaults for the fields GMPO redefines."""
    import dataclasses

    from trl import GRPOConfig

    from gmpo_trl.cli.compare import configs
    from gmpo_trl.cli.parsing import parse
    from gmpo_trl.fields import GMPO_FIELDS

    (tmp_path / "run.yaml").write_text("gmpo_impl: compiled\n")
    argv = ["--config", str(tmp_path / "run.yaml"), "--gmpo_lm_head", "false", "--output_dir",
            str(tmp_path / "out")]  # fmt: skip
    grpo, gmpo = configs(parse("compare", argv))
    assert (gmpo.gmpo_impl, gmpo.gmpo_lm_head) == ("compiled", False)
    assert not any(hasattr(grpo, name) for name, o in GMPO_FIELDS.items() if o.added)
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
