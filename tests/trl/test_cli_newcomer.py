"""What a newcomer reads and waits on (CHANGELOG, Unreleased): ``--help``'s defaults are the
values a run gets, the held-out evaluations say that they run, and ``make train-real`` takes
more options."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from gmpo_trl.cli.defaults import COMMON_TRL_OPTIONS
from gmpo_trl.cli.help import short_help

pytestmark = pytest.mark.trl

ROOT = Path(__file__).resolve().parents[2]


def _shown(text: str) -> dict[str, tuple[str | None, dict[str, str]]]:
    """Each option of ``--help``: its ``Default: X`` and its bracketed ``[K: X]`` values."""
    flat = " ".join(text.split())
    start = flat.index("training (TRL GRPOConfig")
    heads = [flat.index(f" --{name} {metavar} ", start) for name, (metavar, _, _) in
             COMMON_TRL_OPTIONS.items()]  # fmt: skip
    ends = [*heads[1:], flat.index(" help: ", start)]
    out = {}
    for name, head, end in zip(COMMON_TRL_OPTIONS, heads, ends, strict=True):
        said = flat[head:end]
        default = re.search(r"Default: (.+?)\.(?: |$)", said)
        marks = dict(re.findall(r"\[([-\w]+): ([^\]]+)\]", said))
        out[name] = (default.group(1) if default else None, marks)
    return out


def _fmt(value) -> str:
    from gmpo_trl.cli.help import _fmt as fmt

    return fmt(getattr(value, "value", value))  # an enum (save_strategy) by its value


@pytest.mark.parametrize("command", ["train", "compare"])
def test_help_defaults_are_the_config_a_run_builds(tmp_path, command):
    """Each TRL option's ``Default:`` in --help is what ``--model M`` builds (no --dataset: the
    chat task's settings), its ``[--dataset: X]`` what ``--model M --dataset D`` builds, its
    ``[toy: X]`` what the toy run builds. Before: the help said learning rate 1e-05, max_steps
    -1, max_completion_length 512, batch 8 and seed 42 for a --model run, which got 2e-05, 40,
    32, 16 and 0."""
    pytest.importorskip("reasoning_gym")  # --model alone: the chat task, a gym task
    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.parsing import parse

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1 2"}\n')
    runs = {
        None: parse(command, ["--model", str(model)]).config(GMPOConfig),
        "--dataset": parse(command, ["--model", str(model), "--dataset", str(data)]).config(
            GMPOConfig
        ),
        "toy": parse(command, []).config(GMPOConfig),
    }
    shown = _shown(short_help(command))
    for name, (default, marks) in shown.items():
        if name in ("bf16", "use_cpu"):  # the machine's: "true on a GPU, false on CPU"
            continue
        assert default == _fmt(getattr(runs[None], name)), name
        for mark in ("--dataset", "toy"):
            want = _fmt(getattr(runs[mark], name))
            assert marks.get(mark, default) == want, (name, mark)
    assert shown["learning_rate"][0] == _fmt(runs[None].learning_rate) == "2e-05"


def test_help_shows_held_outs_default():
    from gmpo_trl.cli.arguments import ScriptArguments

    text = " ".join(short_help("train").split())
    assert f"(summary.json; 0: none). Default: {ScriptArguments.held_out}." in text
    assert ScriptArguments.held_out == 32


def test_held_out_evaluations_say_they_run(monkeypatch, capsys):
    """A line before each held-out evaluation (minutes on a CPU, silent before) and one with
    its result after."""
    from gmpo_tasks.catalog import TASKS
    from gmpo_trl.cli import runs

    calls = []

    def fake(model, tokenizer, task, *, prompts, max_tokens, temperature):
        calls.append((prompts, max_tokens))
        return {"reward": 0.25, "right": 0.125}

    monkeypatch.setattr(runs, "held_out_reward", fake)
    runs._UNTRAINED.clear()
    plan = SimpleNamespace(task=TASKS["chat_chain_sum"], dataset=None,
                           script=SimpleNamespace(held_out=3))  # fmt: skip
    config = SimpleNamespace(max_completion_length=32, temperature=1.0)
    trainer = SimpleNamespace(model=None, processing_class=None,
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m))  # fmt: skip
    evaluate = runs.held_out(plan, config)
    assert evaluate(trainer, "base-model") == {"reward": 0.25, "right": 0.125}
    assert evaluate(trainer, None) == {"reward": 0.25, "right": 0.125}
    err = capsys.readouterr().err.splitlines()
    assert calls == [(3, 32), (3, 32)]
    assert err[0] == ("held-out reward before training: 12 completions (3 prompts x 4, at most 32 "
                      "tokens each) ...")  # fmt: skip
    assert re.fullmatch(r"held-out reward before training: 0\.250 \(right: 0\.125\) in \d+ s",
                        err[1])  # fmt: skip
    assert err[2].startswith("held-out reward after training: 12 completions")
    assert err[3].startswith("held-out reward after training: 0.250")
    runs._UNTRAINED.clear()


def test_make_train_real_takes_more_options():
    """``make train-real ARGS="--max_steps 4 --held_out 0"``: the recipe passes ARGS on."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^train-real:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe is not None
    assert recipe.group(1).rstrip().endswith("$(ARGS)")
    assert (
        'make train-real ARGS="--max_steps 4 --held_out 0"'
        in (ROOT / "docs" / "real_model.md").read_text()
    )
