"""The up-front checks of ``gmpo train`` / ``gmpo compare`` (CHANGELOG, Unreleased): a typo, a
path, a sampling setting, a reward or a dataset column that cannot be gets one line and exit
status 2 before TRL, transformers or any model is imported or loaded; the table of options that
makes this possible without TRL is TRL's parser's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from gmpo_trl.cli import main

pytestmark = pytest.mark.trl

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("trl", "transformers", "peft", "torch", "datasets")

# a fresh interpreter: run the command, then report its status, its stderr's lines and which of
# HEAVY it had imported when it returned
_CODE = """
import contextlib, io, json, sys
from gmpo_trl.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    rc = main(sys.argv[1:])
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))
print(json.dumps({"rc": rc, "err": err.getvalue().splitlines(), "heavy": heavy}))
""".replace("HEAVY", repr(HEAVY))


def _fresh(*argv: str, cwd: Path | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CODE, *argv], capture_output=True, text=True,
                          timeout=120, cwd=cwd)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _model_dir(tmp_path: Path) -> Path:
    """A directory that check_model takes for a model (config.json); nothing loads it here."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


# --------------------------------------------------------------------------------------------
# a typo: parse and check first, then import
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["train", "--bogus"], "gmpo train: error: unrecognized arguments: --bogus"),
        (["compare", "--max_step", "x"],
         "gmpo compare: error: argument --max_steps/--max-steps: invalid int value: 'x'"),
        (["train", "--lr_scheduler_type", "cosin"], "invalid choice: 'cosin'"),
        (["train", "--temperature", "0"], "--temperature must be a number > 0"),
        (["train", "--model", "/no/such/model"], "--model '/no/such/model': no such directory"),
        (["train", "--reward", "nosuchmodule:fn"], "no module 'nosuchmodule' found"),
        (["train", "--seeds", "2"], "unrecognized arguments: --seeds 2"),
    ],
)  # fmt: skip
def test_a_typo_or_an_upfront_refusal_imports_no_trl(argv, line):
    """Before: TRL's parser (GRPOConfig, transformers' TrainingArguments: ~5 s of CPU, 50 s
    under load) was imported before argv was read; a typo waited for it."""
    got = _fresh(*argv)
    assert got["rc"] == 2
    assert len(got["err"]) == 1 and line in got["err"][0], got["err"]
    assert got["heavy"] == [], got["heavy"]


def test_an_unknown_key_of_the_config_file_imports_no_trl(tmp_path):
    (tmp_path / "run.yaml").write_text("max_stepz: 4\n")
    got = _fresh("train", "--config", str(tmp_path / "run.yaml"))
    assert got == {"rc": 2, "err": ["gmpo train: error: unrecognized arguments: --max_stepz 4"],
                   "heavy": []}  # fmt: skip


def test_a_typo_is_refused_in_well_under_a_second():
    """The time bound: a fresh interpreter refuses ``--bogus`` in under 3 s of CPU, a bound of
    CPU time, which load does not stretch (measured here: 0.13 s; before, 5.5 s: importing
    TRL's GRPOConfig alone takes 4.8 s)."""
    import resource

    code = "import sys; from gmpo_trl.cli import main; raise SystemExit(main(sys.argv[1:]))"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", code, "train", "--bogus"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert proc.returncode == 2 and proc.stderr.endswith("unrecognized arguments: --bogus\n")
    assert cpu < 3.0, cpu


def test_the_table_of_options_is_trls_parser():
    """The table the up-front parse reads (gmpo_trl.cli.option_table) is what TRL's parser of
    the installed versions holds, and those are the versions constraints.txt pins (regenerate:
    python -m gmpo_trl.cli.trl_options)."""
    from gmpo_trl.cli import trl_options
    from gmpo_trl.cli.option_table import VERSIONS

    pins = dict(re.findall(r"^(trl|transformers)==(\S+)$", (ROOT / "constraints.txt").read_text(),
                           re.M))  # fmt: skip
    assert pins == VERSIONS
    assert trl_options.installed_versions() == VERSIONS
    path = ROOT / "adapters" / "gmpo_trl" / "cli" / "option_table.py"
    assert path.read_text() == trl_options.table_text()


def test_the_upfront_parse_gives_trls_values(tmp_path):
    """The two parses of one command line agree: what the table's parser gives each option is
    what TRL's gives it (a value of each kind, a YAML value, an abbreviation, a --no_ flag)."""
    from gmpo_trl.cli import trl_options
    from gmpo_trl.cli.errors import CLIError
    from gmpo_trl.cli.parsing import _UNSET, _values, trl_parser

    (tmp_path / "run.yaml").write_text("learning_rate: '3e-4'\nseed: 7\nreward: m:f\n")
    argv = ["--max_step", "5", "--bf16", "true", "--no_shuffle_dataset", "--reward", "a:b", "c:d",
            "--temperature", "0.7", "--optim", "sgd", "--held_out", "3"]  # fmt: skip
    from_file = {"learning_rate": "3e-4", "seed": 7, "reward": "m:f"}
    path = str(tmp_path / "run.yaml")
    for command in ("train", "compare"):
        trl = trl_parser(command)
        for action in trl._actions:
            action.default = _UNSET
        want = _values(trl, list(argv), dict(from_file), path)
        got = _values(trl_options.parser(command, _UNSET), list(argv), dict(from_file), path)
        assert {k: str(v) for k, v in got.items()} == {k: str(v) for k, v in want.items()}
        assert got["max_steps"] == 5 and got["learning_rate"] == 3e-4 and got["bf16"] is True
        assert got["shuffle_dataset"] is False and got["reward"] == ["a:b", "c:d"]
    with pytest.raises(CLIError, match="argument --bf16: expected one argument"):  # as TRL's
        _values(trl_options.parser("train", _UNSET), ["--bf16"], {}, None)


def test_another_trl_release_leaves_the_table_s_unknowns_to_trls_parser(tmp_path, monkeypatch):
    """Where the installed TRL is not the table's, an option the table lacks (here --max_steps,
    taken out of it) is TRL's parser's to judge: accepted, with its value; where it is the
    table's, the same option is refused as unknown."""
    from gmpo_trl.cli import option_table, trl_options
    from gmpo_trl.cli.errors import CLIError
    from gmpo_trl.cli.parsing import parse

    rows = tuple(r for r in option_table.ACTIONS if r[1] != "max_steps")
    monkeypatch.setattr(option_table, "ACTIONS", rows)
    argv = ["--max_steps", "3", "--output_dir", str(tmp_path / "o")]
    with pytest.raises(CLIError, match="unrecognized arguments: --max_steps 3"):
        parse("train", argv)
    other = {name: "0.0" for name in trl_options.PACKAGES}
    monkeypatch.setattr(trl_options, "installed_versions", lambda: other)
    assert parse("train", argv).values["max_steps"] == 3
    with pytest.raises(CLIError, match="unrecognized arguments: --bogus"):  # TRL's parser's
        parse("train", [*argv, "--bogus"])


# --------------------------------------------------------------------------------------------
# sampling settings
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--temperature", "0", "--temperature must be a number > 0"),
        ("--temperature", "-1", "--temperature must be a number > 0"),
        ("--top_k", "-5", "--top_k must be an integer >= 1, or 0 (off), got -5"),
        ("--top_k", "-1", "--top_k must be an integer >= 1, or 0 (off), got -1"),
        ("--min_p", "2", "--min_p must be a number in [0, 1]"),
        ("--min_p", "-0.1", "--min_p must be a number in [0, 1]"),
        ("--repetition_penalty", "0", "--repetition_penalty must be a number > 0"),
        ("--top_p", "0", "--top_p must be a number in (0, 1]"),
        ("--top_p", "1.5", "--top_p must be a number in (0, 1]"),
    ],
)
def test_invalid_sampling_is_one_line_before_any_model(tmp_path, capsys, option, value, said):
    """Before: accepted, the toy model built and trained until transformers' generate raised
    its ValueError (a traceback)."""
    argv = ["train", option, value, "--max_steps", "1", "--output_dir", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gmpo train: error: {said}"), err
    assert not (tmp_path / "o").exists()


def test_sampling_values_generate_takes_pass():
    from gmpo_trl.cli.errors import CLIError
    from gmpo_trl.cli.upfront import check_sampling

    for ok in ({"temperature": 0.01, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
               {"temperature": 2, "top_k": 50, "top_p": 0.9, "min_p": 1.0, "repetition_penalty": 1.2},
               {"top_k": -1, "use_vllm": True}, {"min_p": None}):  # fmt: skip
        check_sampling(ok)
    for bad in ({"temperature": float("nan")}, {"temperature": True}, {"top_k": 2.5},
                {"repetition_penalty": -1.0}, {"top_k": -2, "use_vllm": True}):  # fmt: skip
        with pytest.raises(CLIError):
            check_sampling(bad)


def test_invalid_sampling_in_the_config_file(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("temperature: 0\n")
    assert main(["train", "--config", str(tmp_path / "run.yaml")]) == 2
    assert "--temperature must be a number > 0" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# a reward's signature and the columns it needs
# --------------------------------------------------------------------------------------------

_REWARDS = """
def good(prompts, completions, **kwargs):
    return [0.0] * len(completions)

def positional(prompts, completions):
    return [0.0] * len(completions)

def needs_answer(prompts, completions, answer, **kwargs):
    return [float(c == a) for c, a in zip(completions, answer)]
"""


def _data(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_reward_that_cannot_take_trls_call_is_refused_up_front(tmp_path):
    """Before: accepted; TRL's call fn(prompts=..., completions=..., completion_ids=..., ...)
    raised its TypeError about two minutes in, after loading and generating."""
    (tmp_path / "myrewards.py").write_text(_REWARDS)
    got = _fresh("train", "--reward", "myrewards:positional", cwd=tmp_path)
    assert got["rc"] == 2 and got["heavy"] == []
    assert got["err"] == [
        "gmpo train: error: --reward 'myrewards:positional': reward function "
        "myrewards:positional: TRL calls it as fn(prompts=..., completions=..., "
        "completion_ids=..., trainer_state=..., log_extra=..., log_metric=..., **columns), and "
        "it takes no keywords 'completion_ids', 'trainer_state', 'log_extra', 'log_metric': add "
        "**kwargs to its parameters"
    ]


def test_a_column_the_reward_needs_is_checked_before_the_model(tmp_path, monkeypatch, capsys):
    """--reward needing a column the dataset lacks: one line after the dataset loads, before
    the model is resolved (a packaged model would be converted there) or loaded."""
    from gmpo_trl.cli import runs

    (tmp_path / "myrewards.py").write_text(_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs, "resolve_model", _no_model)
    data = _data(tmp_path, [{"prompt": "1+1="}, {"prompt": "2+2="}])
    argv = ["train", "--model", str(_model_dir(tmp_path)), "--dataset", str(data),
            "--reward", "myrewards:needs_answer", "--output_dir", str(tmp_path / "o")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"gmpo train: error: --dataset {str(data)!r}: reward function myrewards:needs_answer "
        "needs the dataset column 'answer', which the dataset does not have (TRL passes each "
        "column as a keyword; columns: none but prompt)"
    )


def _no_model(*args, **kwargs):
    raise AssertionError("the model was resolved before the dataset's columns were checked")


def test_the_chat_tasks_reward_needs_its_entry_column(tmp_path, monkeypatch, capsys):
    """--task chat_chain_sum --dataset without 'entry' (the column the task's reward reads).
    Before: the model loaded and generated, then a traceback."""
    pytest.importorskip("reasoning_gym")
    from gmpo_trl.cli import runs

    monkeypatch.setattr(runs, "resolve_model", _no_model)
    data = _data(tmp_path, [{"prompt": "1+1="}])
    argv = ["train", "--task", "chat_chain_sum", "--dataset", str(data),
            "--output_dir", str(tmp_path / "o")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"gmpo train: error: --dataset {str(data)!r}: reward function "
        "gmpo_tasks.chat:ChatTask.reward needs the dataset column 'entry'"
    )


@pytest.mark.parametrize(
    ("source", "columns", "problem"),
    [
        ("def f(prompts, completions, **kw): ...", None, None),
        ("def f(prompts, completions, **kw): ...", ["prompt", "x"], None),
        ("def f(*, completions, **kw): ...", ["prompt"], None),
        ("def f(**kw): ...", ["prompt"], None),
        ("def f(prompts, completions, answer, **kw): ...", None, None),  # columns not known yet
        ("def f(prompts, completions, answer, **kw): ...", ["prompt", "answer"], None),
        ("def f(prompts, completions, answer=None, **kw): ...", ["prompt"], None),
        ("def f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, "
         "answer): ...", ["prompt", "answer"], None),
        ("def f(prompts, completions, answer, **kw): ...", ["prompt"], "needs the dataset column 'answer'"),
        ("def f(prompts, completions, a, b, **kw): ...", ["prompt", "a"], "needs the dataset column 'b'"),
        ("def f(prompts, completions): ...", None, "takes no keywords 'completion_ids'"),
        ("def f(completions, **kw): ...", None, None),  # prompts lands in **kw
        ("def f(completions, prompts, /, **kw): ...", None, "positional-only"),
        ("def f(p, c, **kw): ...", None, None),  # p and c: columns, as far as TRL's call goes
        ("def f(p, c, **kw): ...", ["prompt"], "needs the dataset columns 'p', 'c'"),
        ("def f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric): ...",
         ["prompt", "answer"], "takes no keyword 'answer'"),
    ],
)  # fmt: skip
def test_check_reward_binds_trls_call(source, columns, problem):
    """Each case as TRL's own call of it goes (the call itself is made below where it binds)."""
    from gmpo_trl.rewards import TRL_KEYWORDS, check_reward

    scope: dict = {}
    exec(source, scope)
    fn = scope["f"]
    if problem is None:
        check_reward(fn, columns)
        if columns is not None:  # TRL's call binds: make it
            fn(**{k: [] for k in TRL_KEYWORDS}, **{c: [] for c in columns if c != "prompt"})
    else:
        with pytest.raises(TypeError, match=re.escape(problem)):
            check_reward(fn, columns)


def test_gmpo_trainer_checks_its_rewards_before_loading_the_model(tmp_path):
    """Before: GMPOTrainer tried to load the model (an OSError for a missing one; with a real
    one, the reward's TypeError came at the first step)."""
    from gmpo_tasks import successor as toy
    from gmpo_trl import GMPOConfig, GMPOTrainer

    def positional(prompts, completions):
        return [0.0] * len(completions)

    args = GMPOConfig(**toy.toy_args(str(tmp_path)))
    with pytest.raises(TypeError, match="takes no keywords 'completion_ids'"):
        GMPOTrainer(model="no/such-model", reward_funcs=positional, args=args)
    data = toy.successor_dataset()  # a 'prompt' column only
    with pytest.raises(TypeError, match="needs the dataset column 'answer'"):
        GMPOTrainer(model="no/such-model", args=args, train_dataset=data,
                    reward_funcs=[toy.successor_reward, lambda prompts, completions, answer,
                                  **kw: [0.0] * len(completions)])  # fmt: skip


def test_trls_own_trainer_gets_rewards_checked_before_the_model(tmp_path):
    """gmpo compare's other losses train with TRL's GRPOTrainer, which checks nothing: the
    rewards are checked against the run's dataset (here the task's own) before the task's model
    is built."""
    from types import SimpleNamespace

    from gmpo_tasks.catalog import TASKS
    from gmpo_trl.cli import runs
    from gmpo_trl.cli.errors import CLIError

    def needs_answer(prompts, completions, answer, **kwargs):
        return [0.0] * len(completions)

    class Built:  # stands for GRPOTrainer: never reached
        def __init__(self, **kwargs):
            raise AssertionError("the trainer was built")

    task = TASKS["successor"]
    script = SimpleNamespace(task=task.name, reward=["m:needs_answer"], dataset=None, model=None)
    config = SimpleNamespace(output_dir=str(tmp_path), seed=0, use_vllm=False)
    plan = runs.Plan(script, config, task, (needs_answer,), dataset=None, variant=None)
    with pytest.raises(CLIError, match=r"^the successor task's dataset: reward function .*"
                       r"needs_answer needs the dataset column 'answer'"):  # fmt: skip
        runs.build_trainer(plan, config, Built)
    assert not (tmp_path / "init-model").exists()  # the task's model: not built
