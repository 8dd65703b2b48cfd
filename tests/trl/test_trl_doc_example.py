"""docs/trl.md's Python example runs as written on the CPU, at one optimizer step.

The block after the page's ``<!-- example: tests/trl/test_trl_doc_example.py ... -->`` marker
is executed unchanged but for its size: ``max_steps=10`` becomes ``max_steps=1``, and the
built-in model's name resolves (``gmpo_tasks.pretrained.resolve``, the one ``GMPOTrainer``
calls) to a tiny model built from a config instead of SmolLM2-135M. No hub, no download.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("trl")

from gmpo_tasks import pretrained
from gmpo_trl import GMPOConfig
from gmpo_trl.device import has_accelerator
from tests.trl.test_python_parity import tiny_model_dir

pytestmark = pytest.mark.trl

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "trl.md"
MARK = "<!-- example: tests/trl/test_trl_doc_example.py"
STEPS = "max_steps=10,"  # the example's size, the one thing the test changes


def _page_after_mark() -> str:
    text = PAGE.read_text()
    assert text.count(MARK) == 1, f"{PAGE.name} marks no example (or several) with {MARK!r}"
    return text.split(MARK, 1)[1]


def example_source() -> str:
    block = re.search(r"^```python\n(.*?)^```", _page_after_mark(), re.MULTILINE | re.DOTALL)
    assert block is not None, "no python block after the marker"
    return block.group(1)


def test_the_example_trains_one_step_on_the_cpu(tmp_path, monkeypatch):
    source = example_source()
    assert source.count(STEPS) == 1, f"the example's {STEPS!r} changed: update STEPS"
    model_dir = tiny_model_dir(tmp_path / "tiny")
    calls: list[str] = []
    monkeypatch.setattr(pretrained, "resolve", lambda name: calls.append(name) or str(model_dir))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # the example writes runs/gmpo where it runs

    namespace: dict[str, object] = {"__name__": "trl_doc_example"}
    exec(compile(source.replace(STEPS, "max_steps=1,"), str(PAGE), "exec"), namespace)

    trainer: object = namespace["trainer"]
    assert calls == ["smollm2-135m"]  # the built-in name, through the resolver
    assert trainer.state.global_step == 1  # type: ignore[attr-defined]
    logged = trainer.state.log_history[0]  # type: ignore[attr-defined]
    assert "reward" in logged and "clip_ratio/region_mean" in logged, logged
    args = trainer.args  # type: ignore[attr-defined]
    # written without use_cpu or bf16: the CPU where torch sees no accelerator
    assert (args.use_cpu, args.bf16) == (True, False) or has_accelerator()
    # the page's checkpoint sentence: TRL's default writes one at the end of training
    assert sorted(p.name for p in (work / "runs" / "gmpo").glob("checkpoint-*")) == ["checkpoint-1"]


def test_the_checkpoint_default_is_stated_beside_the_example(tmp_path):
    """Between the example and the next heading: TRL's default, its interval, the setting that
    turns it off, and the file the example writes; GMPOConfig's defaults are those."""
    beside = _page_after_mark().split("\n## ", 1)[0]
    said = " ".join(beside.split())
    assert 'keeps TRL\'s default, `save_strategy="steps"`' in said
    assert "every `save_steps` steps and at the end of training" in said
    assert '`save_strategy="no"` writes none' in said
    assert "runs/gmpo/checkpoint-10" in said and STEPS in example_source()
    args = GMPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert (args.save_strategy, args.save_steps) == ("steps", 500)
