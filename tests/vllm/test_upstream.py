"""The upstream defect gmpo_trl works around (gmpo_trl.vllm_cpu's docstring) is still there:
without the workaround, vLLM's CPU build repacks the linear weights into oneDNN handles, leaves
empty Parameters without ``weight_loader`` in their place, and TRL's weight sync fails. The day
this test fails, vLLM loads weights into a built CPU engine again and
``gmpo_trl.vllm_cpu.apply_workaround`` can go (with this test)."""

from __future__ import annotations

import logging

import pytest
import torch

from gmpo_trl import vllm_cpu
from tests.vllm._support import vllm_model

pytestmark = pytest.mark.vllm


def test_onednn_repack_still_breaks_trls_weight_sync(tmp_path, monkeypatch):
    """The engine as TRL's colocate mode builds it (``trl/generation/vllm_generation.py``: the
    same LLM arguments, but eager, which skips the compile and leaves weight loading as it is),
    then the weights loaded as TRL's ``sync_weights`` loads them: one ``(name, param)`` at a
    time into ``model_runner.model.load_weights``."""
    import vllm._custom_ops as ops
    from trl.trainer.utils import ensure_master_addr_port
    from vllm import LLM

    # the build has oneDNN's matmul (what vLLM's own default reads), so its repack path runs
    assert hasattr(torch.ops._C, "create_onednn_mm_handler")
    monkeypatch.setattr(ops, "_supports_onednn", True)
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(key, value)
    ensure_master_addr_port()
    model = vllm_model(tmp_path)
    llm = LLM(model=model.name_or_path, distributed_executor_backend="external_launcher",
              max_num_batched_tokens=4096, logprobs_mode="processed_logprobs", seed=0,
              gpu_memory_utilization=0.3, enforce_eager=True)  # fmt: skip
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    empty = [
        name
        for name, p in runner.model.named_parameters()
        if p.numel() == 0 and not hasattr(p, "weight_loader")
    ]
    assert "model.layers.0.self_attn.qkv_proj.weight" in empty, empty
    with pytest.raises(AttributeError, match="'Parameter' object has no attribute 'weight_loader'"):
        for name, param in model.named_parameters():
            runner.model.load_weights([(name, param.detach())])


def test_workaround_applied_on_cpu_and_logged_once(monkeypatch, caplog):
    import vllm._custom_ops as ops

    monkeypatch.setattr(ops, "_supports_onednn", True)
    monkeypatch.setattr(vllm_cpu, "_state", {"applied": False})
    with caplog.at_level(logging.WARNING, logger="gmpo_trl.vllm_cpu"):
        assert vllm_cpu.apply_workaround() is True
        assert vllm_cpu.apply_workaround() is True
    assert ops._supports_onednn is False
    lines = [r.getMessage() for r in caplog.records if r.name == "gmpo_trl.vllm_cpu"]
    assert len(lines) == 1
    assert "workaround of vLLM 0.32.0's oneDNN weight repack" in lines[0]
