"""docs/vllm.md's example is complete and runs: the page shows examples/trl/vllm_cpu.py as it
is, and the script trains with vLLM generating (in ``make vllm``'s environment)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl" / "vllm_cpu.py"


def test_the_page_shows_the_example_as_it_is():
    page = (ROOT / "docs" / "vllm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert EXAMPLE.read_text() in blocks


@pytest.mark.vllm
def test_the_example_trains_with_vllm(tmp_path):
    pytest.importorskip("vllm")
    spec = importlib.util.spec_from_file_location("vllm_cpu_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    trainer = example.main(max_steps=2, output_dir=str(tmp_path))
    rewards = [row for row in trainer.state.log_history if "reward" in row]
    assert len(rewards) == 2
    assert all("sampling/sampling_logp_difference/max" in row for row in rewards)  # vLLM sampled
    assert trainer.vllm_generation.llm is not None
