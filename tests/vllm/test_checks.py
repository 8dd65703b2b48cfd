"""Where vLLM cannot run, one line naming the cause, before any engine is built: a head_dim vLLM's
CPU attention does not take, server mode on the CPU, a model vLLM cannot load from its
``name_or_path``; from ``GMPOTrainer`` (a ValueError) and from the ``gmpo`` command (exit 2)."""

from __future__ import annotations

import json

import pytest

from gmpo_tasks import successor as toy
from gmpo_tasks.models import qwen2_model
from gmpo_trl import GMPOConfig, GMPOTrainer, vllm_cpu
from gmpo_trl.cli import main
from tests.vllm._support import TOKENIZER, vllm_args, vllm_model

pytestmark = pytest.mark.vllm


@pytest.fixture
def no_engine(monkeypatch):
    """Fails the test if an engine is built (TRL's VLLMGeneration)."""
    import trl.trainer.grpo_trainer as grpo

    def refuse(*args, **kwargs):
        raise AssertionError("a vLLM engine was built")

    monkeypatch.setattr(grpo, "VLLMGeneration", refuse)


def build(tmp_path, model, **overrides):
    return GMPOTrainer(
        model=model,
        reward_funcs=toy.successor_reward,
        args=GMPOConfig(**vllm_args(tmp_path, **overrides)),
        train_dataset=toy.successor_dataset(),
        processing_class=TOKENIZER,
    )


def test_vllm_runs_on_the_cpu_here():
    """What the checks know without importing vLLM is what vLLM says: its platform is the CPU,
    and CPU_HEAD_DIMS is the installed vLLM's own list of head sizes."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert vllm_cpu.vllm_on_cpu() and current_platform.is_cpu()
    assert vllm_cpu._version() == vllm_cpu.TESTED_VLLM
    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == vllm_cpu.CPU_HEAD_DIMS
    assert vllm_cpu.cpu_head_dims() == vllm_cpu.CPU_HEAD_DIMS


def test_head_dim_refused(tmp_path, no_engine):
    model = qwen2_model(TOKENIZER)  # hidden 32, 4 heads: head_dim 8
    model.save_pretrained(tmp_path / "m")
    model.name_or_path = str(tmp_path / "m")
    with pytest.raises(ValueError, match=r"CPU attention cannot run .*: its head_dim is 8 "):
        build(tmp_path, model)


def test_server_mode_on_cpu_refused(tmp_path, no_engine):
    with pytest.raises(ValueError, match="vllm_mode='server' needs CUDA: TRL's weight sync"):
        build(tmp_path, vllm_model(tmp_path), vllm_mode="server")


def test_model_without_a_path_refused(tmp_path, no_engine):
    model = qwen2_model(TOKENIZER, heads=1)  # never saved: name_or_path is ''
    with pytest.raises(ValueError, match="the model has no name_or_path; vLLM builds its engine"):
        build(tmp_path, model)
    model.name_or_path = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"is not a model directory \(no config\.json\)"):
        build(tmp_path, model)


def test_architecture_vllm_cannot_load_refused(tmp_path, no_engine):
    model = vllm_model(tmp_path)
    config = tmp_path / "init" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "architectures": ["NoSuchForCausalLM"]}))  # fmt: skip
    with pytest.raises(ValueError, match="architecture NoSuchForCausalLM is not one vLLM supports"):
        build(tmp_path, model)


def test_vllm_not_installed_refused(tmp_path, monkeypatch, no_engine):
    monkeypatch.setattr(vllm_cpu, "vllm_installed", lambda: False)
    with pytest.raises(ValueError, match=r"use_vllm=True: vLLM is not available \(not installed\)"):
        build(tmp_path, vllm_model(tmp_path))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--vllm_mode", "server"], "vllm_mode='server' needs CUDA"),
        # the toy task on the user's model (--model alone trains a chat task, which needs
        # reasoning-gym and a chat template, both checked before vLLM's head_dim)
        (
            ["--model", "MODEL8", "--task", "successor"],
            "its head_dim is 8 (hidden_size 32 / num_attention_heads 4)",
        ),
    ],
    ids=["server", "head_dim"],
)
def test_cli_one_line_exit_2(tmp_path, capsys, no_engine, extra, match):
    model = qwen2_model(TOKENIZER)
    model.save_pretrained(tmp_path / "m8")
    extra = [str(tmp_path / "m8") if a == "MODEL8" else a for a in extra]
    for command in ("train", "compare"):
        argv = [command, "--use_vllm", "true", "--output_dir", str(tmp_path / command), *extra]
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"gmpo {command}: error: ") and match in err[0]
