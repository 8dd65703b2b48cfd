"""One GMPOTrainer scoring pass (the loss step's forward and backward) with a bf16 model, its LM
head planned as on CUDA: every GEMM of the (V, H) head takes bf16 operands and writes float32,
and ``gmpo_lm_head_backward="float32"`` reaches the head (tests/core/devices/test_lm_head_gemms.py
drives the same plan for ``token_logprobs`` alone, and proves that CUDA tensors take it)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")

import torch

import gmpo_core.lm_head as lm_head
from gmpo_tasks.models import qwen2_model
from gmpo_trl import GMPOConfig, compat
from tests.core.devices._gemm_recorder import GemmRecorder
from tests.trl._support import TOKENIZER, loss_and_grad, make_inputs, make_trainer

pytestmark = [
    pytest.mark.trl,
    pytest.mark.skipif(
        compat.chunked_head_unsupported() is not None, reason="gmpo_lm_head needs trl >= 1.16"
    ),
]

BF16, F32 = torch.bfloat16, torch.float32


def _scoring_pass_gemms(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, **config: Any) -> Any:
    model = qwen2_model(TOKENIZER, seed=0, tied=False).to(BF16)
    trainer = make_trainer(tmp_path, model=model, **config)
    inputs = make_inputs(trainer, drift=0.5)
    real = getattr(lm_head, "gemm_plan", None)
    if real is not None:  # the code before the plan: nothing to drive

        def cuda_plan(_device: str, *dtypes: Any) -> Any:
            return real("cuda", *dtypes)

        monkeypatch.setattr(lm_head, "gemm_plan", cuda_plan)
    with GemmRecorder() as rec:
        loss, grad = loss_and_grad(trainer, inputs)
    assert torch.isfinite(loss) and torch.isfinite(grad.float()).all()
    vocab = model.get_output_embeddings().weight.shape[0]
    assert vocab not in {model.config.hidden_size, model.config.intermediate_size}
    return [g for g in rec.gemms if g.touches(vocab)]


def test_scoring_pass_runs_the_head_in_bf16_with_float32_results(tmp_path, monkeypatch):
    head = _scoring_pass_gemms(tmp_path, monkeypatch)
    # forward: one logits GEMM; backward: recomputation, dL/dh, dL/dW (one chunk of tokens)
    assert [g.op for g in head] == [
        "aten.mm.dtype_out", "aten.mm.dtype_out", "aten.mm.dtype_out", "aten.addmm.dtype_out",
    ], head  # fmt: skip
    assert all(g.operands == (BF16, BF16) and g.out == F32 for g in head), head


def test_scoring_pass_float32_backward_reaches_the_head(tmp_path, monkeypatch):
    assert GMPOConfig(output_dir=str(tmp_path), use_cpu=True).gmpo_lm_head_backward == "half"
    head = _scoring_pass_gemms(tmp_path, monkeypatch, gmpo_lm_head_backward="float32")
    logits = [g for g in head if g.op == "aten.mm.dtype_out"]
    grads = [g for g in head if g.op != "aten.mm.dtype_out"]
    assert len(logits) == 2 and all(g.operands == (BF16, BF16) for g in logits), head
    assert grads and all(g.operands == (F32, F32) for g in grads), head


def test_an_unknown_backward_precision_is_refused(tmp_path):
    with pytest.raises(ValueError, match="gmpo_lm_head_backward='bf16'"):
        GMPOConfig(output_dir=str(tmp_path), use_cpu=True, gmpo_lm_head_backward="bf16")
