"""``GMPOTrainer``'s loss step on the ``meta`` device: device-generic without a GPU.

A tiny model (built in-process, no hub) and a hand-made batch are moved to ``meta``, where tensors
have no values: any host read raises, and so does a constant made on the CPU. The loss step runs
to the end, and its backward reaches every parameter, with exactly one read to the host per step
(the metrics, intercepted by :class:`tests._host_reads.HostReads`): the adapter synchronizes with
the device once a step. The host terms that are not GMPO (entropy bonus and its adaptive
controller, logged policy loss, MoE aux loss) ride on the same read.

The model runs with eager attention: transformers' sdpa mask builder asks the host whether the
padding mask is all ones (``padding_mask.all()`` in ``masking_utils._ignore_causal_mask_sdpa``),
a read of the model's, not the adapter's. ``top_entropy_quantile`` < 1 is left out: GRPOTrainer's
own ``get_high_entropy_mask``, which the adapter reuses, selects the valid tokens by boolean
indexing (``entropies[mask.bool()]``), a data-dependent shape that reads the host. The stats
reductions both adapters call are covered on meta in tests/core/devices/test_metrics_devices.py. The tokens
are scored by gmpo's LM head (``gmpo_lm_head``, the default); TRL 1.16's own
``ChunkedLogProbFunction`` enters ``torch.autocast`` for the input's device type, which ``meta``
does not have ("unknown device type for autocast").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch

from tests._host_reads import HostReads
from tests.trl._support import make_inputs, make_trainer

pytestmark = pytest.mark.trl

B, T = 6, 6

# name: (config overrides, make_inputs arguments, extra inputs, vLLM IS mode)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, ...], str | None]] = {
    "plain": ({}, {"drift": 0.5}, (), None),
    "beta, dual clip": ({"beta": 0.05, "delta": 1.5}, {"drift": 0.5, "ref_drift": 0.3}, (), None),
    "tool mask": ({}, {"drift": 0.5}, ("tool_mask",), None),
    "token IS weights": ({"beta": 0.05}, {"drift": 0.3, "ref_drift": 0.3}, (), "token_mask"),
    "sequence IS weights": ({}, {"drift": 0.3}, (), "sequence_truncate"),
    "entropy bonus": ({"entropy_coef": 0.1}, {"drift": 0.5}, (), None),
    "adaptive entropy": (
        {"use_adaptive_entropy": True, "entropy_coef": 0.0, "entropy_target": 3.2},
        {"drift": 0.5},
        (),
        None,
    ),
    "off-policy mask, beta": (
        {"off_policy_mask_threshold": 0.05, "beta": 0.05},
        {"drift": 0.3, "ref_drift": 0.3},
        ("sampling_per_token_logps",),
        None,
    ),
}


def _meta_step(tmp: Path, config: dict[str, Any], spec: dict[str, Any], extra: tuple[str, ...],
               is_mode: str | None, model: Any = None) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    trainer = make_trainer(tmp, model=model, **config)
    inputs = make_inputs(trainer, **spec)
    if "tool_mask" in extra:
        inputs["tool_mask"] = torch.ones_like(inputs["completion_mask"])
    if "sampling_per_token_logps" in extra:
        inputs["sampling_per_token_logps"] = inputs["old_per_token_logps"] - 0.3
    if is_mode is not None:  # use_vllm needs vLLM at construction; the loss step reads these
        trainer.use_vllm = True
        trainer.vllm_importance_sampling_correction = True
        trainer.vllm_importance_sampling_mode = is_mode
        shape = (B, 1) if is_mode.startswith("sequence") else (B, T)
        inputs["importance_sampling_ratio"] = torch.ones(shape)
    trainer.model.set_attn_implementation("eager")
    trainer.model.to("meta")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    return trainer, {k: v.to("meta") for k, v in inputs.items()}


def _moe_model() -> Any:
    """A tiny Qwen2-MoE (router aux loss on); experts as batched matmuls, since transformers'
    default grouped_mm has no float32 kernel on meta."""
    from tests.trl._support import tiny_moe

    model = tiny_moe()
    model.set_experts_implementation("batched_mm")
    return model


@pytest.mark.parametrize("name", [*CASES, "MoE aux loss, entropy bonus"])
def test_loss_step_on_meta_reads_the_host_once_per_step(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gmpo_trl import head_swap as lm_head

    head_calls = []
    original = lm_head.token_logprobs

    def counting(*args: Any, **kwargs: Any) -> Any:
        head_calls.append(args[0].device.type)
        return original(*args, **kwargs)

    monkeypatch.setattr(lm_head, "token_logprobs", counting)
    if name in CASES:
        trainer, inputs = _meta_step(tmp_path, *CASES[name])
    else:
        case = ({"entropy_coef": 0.1}, {"drift": 0.5}, (), None)
        trainer, inputs = _meta_step(tmp_path, *case, model=_moe_model())
        assert trainer.aux_loss_enabled
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    head_calls.clear()  # the inputs' log-probs were scored on the CPU
    with HostReads() as reads:
        for step in range(2):  # the second micro-step closes the accumulation window
            trainer.accelerator.gradient_state._set_sync_gradients(step == 1)
            loss = trainer._compute_loss(trainer.model, dict(inputs))
            assert len(reads.calls) == step + 1, reads.calls  # one read per step
            assert reads.calls[-1][0] == "tolist" and len(reads.calls[-1][1]) == 1
            assert loss.is_meta and loss.shape == ()
            loss.backward()
    trainer.accelerator.gradient_state._set_sync_gradients(True)
    assert all(p.grad is not None and p.grad.is_meta for p in params)
    logged = {k: v for k, v in trainer._metrics["train"].items() if v}
    assert {"clip_ratio/region_mean", "log_ratio/min", "entropy"} <= set(logged)
    for key, values in logged.items():  # entropy_coef: once per optimizer step, as in TRL
        assert len(values) == (1 if key == "entropy_coef" else 2), key
        assert isinstance(values[-1], float), key
    if "beta" in name:
        assert "kl" in logged
    if "entropy" in name:
        assert "policy_loss" in logged
    if "aux loss" in name:
        assert "aux_loss" in logged
    assert head_calls == ["meta", "meta"]  # gmpo's LM head (the default) scored the tokens
