"""The messages a newcomer to vLLM meets first: ``--help`` on ``--use_vllm``, a refusal that
names where the head size comes from, in one line and before vLLM is imported (10-20 s and a
dozen lines of warnings), and TRL's warning about the vLLM version once, not six times.

The first two run in every environment (vLLM faked where needed); the others in ``make vllm``'s.
"""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from gmpo_trl import vllm_cpu
from gmpo_trl.cli.help import short_help
from tests.vllm._env import ROOT, fresh_env

COLOCATE = SimpleNamespace(use_vllm=True, vllm_mode="colocate", use_cpu=True)


def test_help_says_vllm_runs_on_the_cpu_too():
    text = " ".join(short_help("train").split())
    assert "--use_vllm BOOL Generate with vLLM, on a GPU or the CPU (docs/vllm.md)." in text
    assert "GPU; pip install vllm" not in text


def saved_qwen2(path, **config):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    Qwen2ForCausalLM(Qwen2Config(vocab_size=16, intermediate_size=16, num_hidden_layers=1,
                                 num_key_value_heads=1, **config)).save_pretrained(path)  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("config", "source"),
    [
        (dict(hidden_size=128, num_attention_heads=2, head_dim=48),
         "its head_dim is 48 (the config's head_dim; hidden_size / num_attention_heads is "
         "128 / 2 = 64)"),
        (dict(hidden_size=32, num_attention_heads=4),
         "its head_dim is 8 (hidden_size 32 / num_attention_heads 4)"),
    ],
    ids=["explicit", "derived"],
)  # fmt: skip
def test_head_dim_refusal_names_its_source(tmp_path, monkeypatch, config, source):
    """vLLM faked as installed on the CPU (its head sizes: CPU_HEAD_DIMS)."""
    monkeypatch.setattr(vllm_cpu, "vllm_installed", lambda: True)
    monkeypatch.setattr(vllm_cpu, "vllm_on_cpu", lambda: True)
    monkeypatch.setattr(vllm_cpu, "cpu_head_dims", lambda: vllm_cpu.CPU_HEAD_DIMS)
    monkeypatch.setattr(vllm_cpu, "_check_architecture", lambda name, path: None)
    path = saved_qwen2(tmp_path / "m", **config)
    with pytest.raises(ValueError, match=re.escape(source)) as err:
        vllm_cpu.check_vllm(str(path), COLOCATE)
    assert "\n" not in str(err.value)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=fresh_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.vllm
@pytest.mark.parametrize("command", ["train", "compare"])
def test_refusal_is_one_line_before_vllm_is_imported(tmp_path, command):
    pytest.importorskip("vllm")
    path = saved_qwen2(tmp_path / "m", hidden_size=32, num_attention_heads=4)
    argv = [command, "--use_vllm", "true", "--model", str(path), "--task", "successor",
            "--output_dir", str(tmp_path)]  # fmt: skip
    done = run_python(f"import sys; from gmpo_trl.cli import main; rc = main({argv!r}); "
                      "print(rc, 'vllm' in sys.modules)")  # fmt: skip
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"gmpo {command}: error: use_vllm=True: vLLM's CPU attention cannot run {str(path)!r}: "
        "its head_dim is 8 (hidden_size 32 / num_attention_heads 4); it takes "
        + ", ".join(map(str, vllm_cpu.CPU_HEAD_DIMS))
    ]


@pytest.mark.vllm
def test_trls_vllm_warning_said_once():
    """Importing the trainer (five of TRL's checks) and preparing two runs: one warning."""
    pytest.importorskip("vllm")
    done = run_python(
        "from types import SimpleNamespace\n"
        "from gmpo_trl import GMPOTrainer, vllm_cpu\n"
        "args = SimpleNamespace(use_vllm=True, vllm_mode='colocate', use_cpu=True)\n"
        "vllm_cpu.prepare(None, args)\n"
        "vllm_cpu.prepare(None, args)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("TRL currently supports vLLM versions") == 1, done.stderr
