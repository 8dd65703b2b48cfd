"""The upstream defect gmpo_trl works around (gmpo_trl.vllm_cpu's docstring) is still there:
without the workaround, vLLM's CPU build packs the linear weights into a kernel's layout (on CPUs
with AMX tiles sgl-kernel's, else a oneDNN handle where oneDNN can build a bf16 matmul), leaves
empty Parameters without ``weight_loader`` in their place, and TRL's weight sync fails. The day
this test fails on a CPU where a path applies, vLLM loads weights into a built CPU engine again
and that half of ``gmpo_trl.vllm_cpu.apply_workaround`` can go (with this test).

Each path applies only where vLLM 0.32 takes it, which depends on the CPU: sgl-kernel where torch
sees AMX tiles (``amx_tile``, ``amx_bf16`` in /proc/cpuinfo), oneDNN where it builds a bf16
matmul (AVX-512-BF16 or AMX; on an AVX2-only CPU it cannot, vLLM keeps the plain weight, and the
defect does not arise). Elsewhere the path's case skips, naming the CPU's flags."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from gmpo_trl import vllm_cpu
from tests.vllm._support import vllm_model

pytestmark = pytest.mark.vllm

#: the flags the two paths depend on, as /proc/cpuinfo names them
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
#: the test model's qkv projection, (N, K): bf16 of 6 KiB, within sgl-kernel's 1 MiB
QKV = (96, 32)


def cpu_flags() -> str:
    """Which of :data:`FLAGS` this CPU has, for the skip reasons."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU flags unknown (no /proc/cpuinfo)"
    words = set(text.split())
    return "CPU flags: " + ", ".join(f"{f} {'yes' if f in words else 'no'}" for f in FLAGS)


def why_not(path: str) -> str | None:
    """None where vLLM 0.32 packs the test model's weights on ``path`` on this CPU, else why not
    (asked the way vLLM's ``dispatch_cpu_unquantized_gemm`` decides)."""
    if path == "sgl-kernel":
        if torch.cpu._is_amx_tile_supported():
            return None
        return f"vLLM's sgl-kernel packing needs AMX tiles, which torch does not see; {cpu_flags()}"
    if not hasattr(torch.ops._C, "create_onednn_mm_handler"):
        return "this vLLM build has no oneDNN matmul"
    import vllm._custom_ops as ops

    try:
        ops.create_onednn_mm(torch.zeros(QKV, dtype=torch.bfloat16).t(), 32)
    except RuntimeError as err:
        line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"oneDNN cannot build a bf16 matmul on this CPU ({line}): vLLM keeps plain "
                f"weights; {cpu_flags()}")  # fmt: skip
    return None


def build_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, sgl: bool, onednn: bool):
    """The engine as TRL's colocate mode builds it (``trl/generation/vllm_generation.py``: the
    same LLM arguments, but eager, which skips the compile and leaves weight loading as it is),
    with vLLM's own sgl-kernel check (``sgl``, else one answering False) and its oneDNN switch
    set to ``onednn``; the trainer's model and the engine's."""
    import vllm._custom_ops as ops
    from trl.trainer.utils import ensure_master_addr_port
    from vllm import LLM
    from vllm.model_executor.layers import utils as layer_utils

    vllm_sgl = vllm_cpu.replaced.get("check_cpu_sgl_kernel", layer_utils.check_cpu_sgl_kernel)
    monkeypatch.setattr(layer_utils, "check_cpu_sgl_kernel",
                        vllm_sgl if sgl else (lambda *args, **kwargs: False))  # fmt: skip
    monkeypatch.setattr(ops, "_supports_onednn", onednn)
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(key, value)
    ensure_master_addr_port()
    model = vllm_model(tmp_path)
    llm = LLM(model=model.name_or_path, distributed_executor_backend="external_launcher",
              max_num_batched_tokens=4096, logprobs_mode="processed_logprobs", seed=0,
              gpu_memory_utilization=0.3, enforce_eager=True)  # fmt: skip
    return model, llm.llm_engine.model_executor.driver_worker.model_runner.model


def emptied(engine_model) -> list[str]:
    """The engine's parameters replaced by empty ones without ``weight_loader``."""
    return [
        name
        for name, p in engine_model.named_parameters()
        if p.numel() == 0 and not hasattr(p, "weight_loader")
    ]


def load_as_trl_does(model, engine_model) -> None:
    """TRL's ``sync_weights``: one ``(name, param)`` at a time into ``load_weights``."""
    for name, param in model.named_parameters():
        engine_model.load_weights([(name, param.detach())])


@pytest.mark.parametrize("path", ["sgl-kernel", "oneDNN"])
def test_cpu_weight_packing_still_breaks_trls_weight_sync(tmp_path, monkeypatch, path):
    """vLLM's own choice on one packing path (the other off), then TRL's load fails."""
    reason = why_not(path)
    if reason is not None:
        pytest.skip(f"the {path} path does not apply here: {reason}")
    model, engine_model = build_engine(
        tmp_path, monkeypatch, sgl=path == "sgl-kernel", onednn=path == "oneDNN"
    )
    assert "model.layers.0.self_attn.qkv_proj.weight" in emptied(engine_model)
    with pytest.raises(AttributeError, match="'Parameter' object has no attribute 'weight_loader'"):
        load_as_trl_does(model, engine_model)


def test_plain_weights_where_no_path_applies(tmp_path, monkeypatch):
    """An AVX2-only CPU, as far as vLLM asks: no AMX tiles, and oneDNN refusing the bf16 matmul
    (its error there). vLLM, its defaults untouched, keeps every weight plain and TRL's load
    works without the workaround: there the defect does not arise."""
    import vllm._custom_ops as ops

    def refuse(*args, **kwargs):
        raise RuntimeError("could not create a primitive descriptor for the matmul primitive")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(ops, "create_onednn_mm", refuse)
    assert why_not("sgl-kernel") is not None and why_not("oneDNN") is not None
    model, engine_model = build_engine(tmp_path, monkeypatch, sgl=True, onednn=True)
    assert not emptied(engine_model)
    load_as_trl_does(model, engine_model)


def test_workaround_applied_on_cpu_and_logged_once(monkeypatch, caplog):
    """vLLM 0.32 has both names the workaround sets; it sets them, says so once and returns
    True (tests/vllm/test_workaround_names.py: a vLLM without them)."""
    import vllm._custom_ops as ops
    from vllm.model_executor.layers import utils as layer_utils

    monkeypatch.setattr(ops, "_supports_onednn", True)
    monkeypatch.setattr(layer_utils, "check_cpu_sgl_kernel", layer_utils.check_cpu_sgl_kernel)
    monkeypatch.setattr(vllm_cpu, "_state", {**vllm_cpu._state, "applied": False})
    with caplog.at_level(logging.WARNING, logger="gmpo_trl.vllm_cpu"):
        assert vllm_cpu.apply_workaround() is True
        assert vllm_cpu.apply_workaround() is True
    assert ops._supports_onednn is False
    assert layer_utils.check_cpu_sgl_kernel(*QKV, torch.bfloat16) is False
    lines = [r.getMessage() for r in caplog.records if r.name == "gmpo_trl.vllm_cpu"]
    assert len(lines) == 1
    assert "a workaround of vLLM 0.32.0's CPU weight repack" in lines[0]
