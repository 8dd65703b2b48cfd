"""The run plan (CHANGELOG, Unreleased: one checked plan): from ``gmpo train``'s parsed arguments
to the loss, no first-party module is visited twice and every check runs once; what the user set
is known from parsing, so a loss variant beside an option it replaces is refused whatever the
option's value.

The trace (:func:`trace_train`) follows the calls with ``sys.setprofile``:

- first-party code is the frames whose module is in the ``gmpo_*`` packages; the host's frames
  (TRL, transformers, torch) are transparent: a call's caller is the nearest first-party frame
  below it on the stack;
- a *visit* of a module is opened by a call into it from another module, and keyed by the
  caller's visit: the calls that one visit of a module makes into a second module are one visit
  of it (read once), the same module entered from elsewhere is a second visit;
- not on the path: module bodies run by an import and a package's lazy ``__getattr__``, and
  the host's training loop (transformers' ``Trainer.train``: generation, rewards, callbacks),
  except the frames on the stack when ``gmpo_core.gmpo_loss`` is first entered (the trainer's
  loss step, reached from the run that called ``train()``);
- the trace starts when ``parse`` returns (the command's frames then on the stack open the
  first visits) and ends at the loss.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any

import pytest

pytest.importorskip("trl")

from gmpo_trl.cli import main, parsing
from gmpo_variants import VARIANTS

pytestmark = pytest.mark.trl

FIRST_PARTY = ("gmpo_core", "gmpo_trl", "gmpo_tasks", "gmpo_variants", "gmpo_stats")


def _module(frame: Any) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _first_party(frame: Any) -> bool:
    return _module(frame).split(".")[0] in FIRST_PARTY


class Trace:
    """The visits and the first-party calls from the parsed arguments to the loss."""

    def __init__(self) -> None:
        self.visit_of: dict[int, int] = {}  # id(frame) -> its visit
        self.visits: dict[tuple[str, int | None], int] = {}  # (module, caller's visit) -> visit
        self.order: list[tuple[str, str, str | None]] = []  # (module, entered by, caller module)
        self.calls: collections.Counter[str] = collections.Counter()  # qualified name -> calls
        self.importing = 0
        self.in_loop = self.reached_loss = False

    def enter(self, frame: Any) -> None:
        """Give ``frame`` its visit: its caller's where it is in the caller's module."""
        caller = frame.f_back
        while caller is not None and id(caller) not in self.visit_of:
            caller = caller.f_back
        module = _module(frame)
        parent = None if caller is None else self.visit_of[id(caller)]
        if caller is not None and _module(caller) == module:
            self.visit_of[id(frame)] = self.visit_of[id(caller)]
            return
        key = (module, parent)
        if key not in self.visits:
            self.visits[key] = len(self.visits)
            by = None if caller is None else _module(caller)
            self.order.append((module, frame.f_code.co_qualname, by))
        self.visit_of[id(frame)] = self.visits[key]

    def start(self, frame: Any) -> None:
        stack = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        for f in reversed(stack):
            if _first_party(f):
                self.enter(f)

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if self.reached_loss:
            return
        if event == "return":
            if code.co_name == "<module>" and self.importing:
                self.importing -= 1
            elif not self.in_loop:
                self.visit_of.pop(id(frame), None)  # a frame's id is reused once it returned
            return
        if event != "call":
            return
        if code.co_name == "<module>":
            self.importing += 1
            return
        if self.importing:
            return
        if code.co_name == "train" and _module(frame) == "transformers.trainer":
            self.in_loop = True
            return
        if not _first_party(frame) or code.co_qualname == "__getattr__":
            return
        self.calls[code.co_qualname] += 1
        if _module(frame) == "gmpo_core.loss" and code.co_name == "gmpo_loss":
            chain = []
            while frame is not None:
                if _first_party(frame) and id(frame) not in self.visit_of:
                    chain.append(frame)
                frame = frame.f_back
            for f in reversed(chain):
                self.enter(f)
            self.reached_loss = True
        elif not self.in_loop:
            self.enter(frame)

    def visited(self) -> collections.Counter[str]:
        """Module -> its visits."""
        return collections.Counter(module for module, _, _ in self.order)


def trace_train(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Trace:
    """``gmpo train`` with ``argv``, traced from the parsed arguments to the loss (the config's
    checks forget the values an earlier test checked)."""
    from gmpo_trl import config

    config._checked.cache_clear()
    trace = Trace()
    parse = parsing.parse

    def traced_parse(*args: Any, **kwargs: Any) -> Any:
        parsed = parse(*args, **kwargs)
        trace.start(sys._getframe(1))
        sys.setprofile(trace)
        return parsed

    monkeypatch.setattr(parsing, "parse", traced_parse)
    try:
        assert main(["train", *argv]) == 0
    finally:
        sys.setprofile(None)
    return trace


@pytest.fixture
def user_inputs(tmp_path, monkeypatch):
    """A local model directory, a prompt file and a reward module in the current directory."""
    from gmpo_tasks.chars import char_tokenizer
    from gmpo_tasks.models import qwen2_model

    tokenizer = char_tokenizer()
    qwen2_model(tokenizer, seed=0).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{d}="}) + "\n" for d in range(8))
    )
    (tmp_path / "plan_rewards.py").write_text(
        "def always(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n"
    )
    monkeypatch.chdir(tmp_path)
    return ["--model", "model", "--dataset", "prompts.jsonl", "--reward", "plan_rewards:always",
            "--max_completion_length", "2", "--per_device_train_batch_size", "8"]  # fmt: skip


@pytest.mark.parametrize("inputs", ["task", "user"])
def test_from_parsed_arguments_to_the_loss_no_module_is_visited_twice(
    tmp_path, monkeypatch, request, inputs
):
    """(CHANGELOG, Unreleased): ``gmpo train --epsilon 0.3`` passed parsing, the checks, the
    config, the options and the task registry twice or three times (``train -> parsing ->
    checks``, ``runs -> checks``, ``trainer -> config -> options`` again)."""
    argv = ["--epsilon", "0.3", "--max_steps", "1", "--output_dir", str(tmp_path / "out")]
    if inputs == "user":
        argv += request.getfixturevalue("user_inputs")
    trace = trace_train(monkeypatch, argv)
    assert trace.reached_loss
    twice = {module: n for module, n in trace.visited().items() if n > 1}
    # the user's dataset: its columns checked against the rewards by the plan, before a model
    # is resolved (a packaged one converted), and by GMPOTrainer when it is built (a Python
    # user's only check); the task's dataset: by GMPOTrainer alone
    again = [by for module, _, by in trace.order if module == "gmpo_trl.rewards"]
    if inputs == "user":
        assert again == ["gmpo_trl.cli.upfront", "gmpo_trl.trainer"], trace.order
        twice.pop("gmpo_trl.rewards")
    assert twice == {}, trace.order
    # the path: the command, its plan, the config and the core's rules, the trainer, the loss
    for module in (
        "gmpo_trl.cli.train",
        "gmpo_trl.cli.runs",
        "gmpo_trl.cli.checks",
        "gmpo_trl.config",
        "gmpo_core.options",
        "gmpo_trl.trainer",
        "gmpo_core.loss",
    ):
        assert module in trace.visited(), (module, trace.order)  # fmt: skip
    # each check once (the config's own rules: at construction only; the plan and the trainer
    # read the same check of the same values, check_config's record, which runs nothing again)
    for name in ("task_of", "_check_values", "check_hyperparameters"):
        assert trace.calls[name] == 1, (name, trace.calls)
    ran = 1 if inputs == "user" else 0
    for name in ("resolve_reward", "load_dataset"):
        assert trace.calls[name] == ran, (name, trace.calls)
    for name in ("check_model", "check_dataset"):  # up front, while parsing: not again
        assert trace.calls[name] == 0, (name, trace.calls)


def test_a_loss_variant_is_resolved_and_checked_once(tmp_path, monkeypatch):
    """``gmpo train --variant gmpo_narrow``: the variant is resolved once and each option it
    replaces checked once, by the config's check (its values) and the plan's (what the user set,
    beyond the values); the trainer takes the plan's. Regression: ``check_variant`` ran at the
    config's construction and again in ``build_plan``, every conflict checked twice."""
    argv = ["--variant", "gmpo_narrow", "--beta", "0", "--max_steps", "1", "--output_dir",
            str(tmp_path / "out")]  # fmt: skip
    trace = trace_train(monkeypatch, argv)
    assert trace.reached_loss  # gmpo_narrow's own call of gmpo_loss
    for name in ("_check_values", "_variant_of", "resolve", "check_variant"):
        assert trace.calls[name] == 1, (name, trace.calls)


# --------------------------------------------------------------------------------------------
# what the user set, known from parsing
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epsilon", "0.4"], "epsilon=0.4 does not apply to loss_variant='gmpo_narrow': the "
         "variant's clip is its own; remove it"),
        (["--gmpo_impl", "plain"], "gmpo_impl='plain' does not apply to loss_variant="
         "'gmpo_narrow': the variant is its own code; remove it"),
        (["--config", "run.yaml"], "epsilon=0.4 does not apply to loss_variant='gmpo_narrow'"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["train", "compare"])
def test_an_option_a_variant_replaces_is_refused_at_its_default_value(
    tmp_path, capsys, monkeypatch, command, argv, message
):
    """Was accepted silently: ``check_variant`` compared epsilon with its default (0.4)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("epsilon: 0.4\n")
    full = [command, *argv, "--variant", "gmpo_narrow", "--max_steps", "1", "--output_dir",
            str(tmp_path / "out")]  # fmt: skip
    assert main(full) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gmpo {command}: error: {message}"), err
    assert not (tmp_path / "out").exists()


def test_a_variant_beside_what_it_does_not_replace_is_planned(tmp_path):
    """``--beta 0`` is what the variant asks for, and epsilon left unset is no conflict; built
    in Python, a GMPOConfig cannot know what was set: its default epsilon passes."""
    from gmpo_tasks.successor import toy_args
    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.runs import build_plan

    argv = ["--variant", "gmpo_narrow", "--beta", "0", "--output_dir", str(tmp_path)]
    plan = build_plan(parsing.parse("train", argv))
    assert plan.variant is not None and plan.config.loss_variant == "gmpo_narrow"
    assert plan.variant is plan.checked.variant is VARIANTS["gmpo_narrow"]
    config = GMPOConfig(**toy_args(str(tmp_path), loss_variant="gmpo_narrow", epsilon=0.4))
    assert config.epsilon == 0.4


def test_the_trainer_checks_a_config_again_only_when_it_changed(tmp_path, monkeypatch):
    """The config's rules run at its construction; GMPOTrainer reads the same check where the
    checked values are the same (the same config, a copy, an unpickled one), and runs them again
    where one changed. Nothing is kept on the config: no ``__setattr__`` or ``__getstate__`` of
    its own, no attribute beside GRPOConfig's but its fields. Its variant is the check's.
    Regression: the check's record and the resolved variant were stashed in the config's
    ``__dict__`` (``_checked``, ``_resolved_variant``), kept valid by those two overrides."""
    import functools
    import pickle

    from trl import GRPOConfig

    from gmpo_tasks.models import qwen2_model
    from gmpo_tasks.successor import successor_dataset, successor_reward, toy_args
    from gmpo_trl import GMPOConfig, GMPOTrainer
    from gmpo_trl import config as config_module
    from gmpo_trl.fields import GMPO_FIELDS
    from tests.trl._support import TOKENIZER, make_trainer

    runs: list[object] = []
    check_beta = config_module.check_beta
    monkeypatch.setattr(
        config_module, "check_beta", lambda *a, **k: (runs.append(a), check_beta(*a, **k))[1]
    )
    fresh = functools.lru_cache(maxsize=64)(config_module._check_values)
    monkeypatch.setattr(config_module, "_checked", fresh)  # no check of an earlier test
    trainer = make_trainer(tmp_path, loss_variant="gmpo_narrow")
    assert len(runs) == 1 and trainer._variant is VARIANTS["gmpo_narrow"]
    config = GMPOConfig(**toy_args(str(tmp_path)))
    assert len(runs) == 2
    assert "__setattr__" not in vars(GMPOConfig) and "__getstate__" not in vars(GMPOConfig)
    plain = GRPOConfig(**{k: v for k, v in toy_args(str(tmp_path)).items()
                          if k in GRPOConfig.__dataclass_fields__})  # fmt: skip
    added = {name for name, option in GMPO_FIELDS.items() if option.added}
    assert set(vars(config)) - set(vars(plain)) == added
    again = pickle.loads(pickle.dumps(config))
    assert config_module.check_config(again) is config_module.check_config(config)
    assert len(runs) == 2
    build = dict(reward_funcs=successor_reward, train_dataset=successor_dataset(),
                 processing_class=TOKENIZER)  # fmt: skip
    config.max_steps = 3  # a field no check reads
    GMPOTrainer(model=qwen2_model(TOKENIZER, seed=0), args=config, **build)
    assert len(runs) == 2
    config.epsilon = 0.3  # a checked field: checked again
    GMPOTrainer(model=qwen2_model(TOKENIZER, seed=0), args=config, **build)
    assert len(runs) == 3
