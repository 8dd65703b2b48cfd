"""GMPOTrainer's loss step against GRPOTrainer's: on-policy GMPO equals GRPOTrainer(loss_type="grpo") with the host terms (docs/semantics.md S10), the adaptive entropy controller, the metrics, eval mode, the compiled path, bf16 and the LM head."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch

from gmpo_core import gmpo_loss
from gmpo_trl import GMPOTrainer
from tests.trl._support import (
    GRPOConfig,
    GRPOTrainer,
    assert_same,
    enable_is,
    inputs_of,
    is_ratio,
    last_metrics,
    loss_and_grad,
    make_inputs,
    make_trainer,
    model_logps,
)

pytestmark = pytest.mark.trl


# --------------------------------------------------------------------------------------------
# on-policy GMPO == GRPOTrainer(loss_type="grpo") (docs/semantics.md S10), host terms included
# --------------------------------------------------------------------------------------------

ON_POLICY = {
    "plain, empty and zero-advantage rows": ({}, {"empty_row": True, "zero_advantage": True}),
    "entropy bonus": ({"entropy_coef": 0.05}, {}),
    "tool mask": ({}, {"tool_mask": True}),
    "off-policy mask": ({"off_policy_mask_threshold": 0.05}, {"sampling": True}),
    "sequence IS weights": ({}, {"is_mode": "sequence_truncate"}),
}


@pytest.mark.parametrize("name", list(ON_POLICY))
def test_on_policy_gradient_equals_grpo(tmp_path, name):
    config, spec = ON_POLICY[name]
    spec = dict(spec)
    sampling, is_mode = spec.pop("sampling", False), spec.pop("is_mode", None)
    ours = make_trainer(tmp_path, **config)
    grpo = make_trainer(tmp_path, GRPOTrainer, GRPOConfig, loss_type="grpo", **config)
    inputs = inputs_of(ours, spec)
    if sampling:
        logps = model_logps(ours, inputs)
        g = torch.Generator().manual_seed(5)
        inputs["sampling_per_token_logps"] = logps + 0.6 * torch.rand(logps.shape, generator=g)
    if is_mode:
        for t in (ours, grpo):
            enable_is(t, is_mode)
        inputs["importance_sampling_ratio"] = is_ratio(inputs, is_mode)
    loss, grad = loss_and_grad(ours, inputs)
    grpo_loss, grpo_grad = loss_and_grad(grpo, inputs)
    assert_same(loss, grpo_loss)
    assert_same(grad, grpo_grad)
    assert grad.abs().max() > 0
    mine, theirs = last_metrics(ours), last_metrics(grpo)
    for key in ("entropy", "policy_loss", "entropy_coef"):
        if key in theirs:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6), key


def test_adaptive_entropy_controller_follows_grpo(tmp_path):
    """Same coefficient, gate and window state as GRPOTrainer's controller over several
    optimizer steps with gradient accumulation (on-policy, so the gradients agree too)."""
    config = dict(
        use_adaptive_entropy=True, entropy_coef=0.0, entropy_target=3.2, entropy_coef_delta=0.01
    )
    ours = make_trainer(tmp_path, **config)
    grpo = make_trainer(tmp_path, GRPOTrainer, GRPOConfig, loss_type="grpo", **config)
    for step in range(4):
        for t in (ours, grpo):  # the window closes on the second micro-batch
            t.accelerator.gradient_state._set_sync_gradients(step % 2 == 1)
        inputs = make_inputs(ours, seed=step)
        loss, grad = loss_and_grad(ours, inputs, accumulation=2)
        grpo_loss, grpo_grad = loss_and_grad(grpo, inputs, accumulation=2)
        assert_same(loss, grpo_loss)
        assert_same(grad, grpo_grad)
        assert ours.entropy_coef == pytest.approx(grpo.entropy_coef)
        assert ours._last_world_entropy == pytest.approx(grpo._last_world_entropy)
    assert ours.entropy_coef > 0  # the controller moved (entropy is below the target)
    for t in (ours, grpo):
        t.accelerator.gradient_state._set_sync_gradients(True)


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------


def test_metrics_are_the_cores_statistics(tmp_path):
    ours = make_trainer(tmp_path, delta=2.0, beta=0.05)
    inputs = make_inputs(ours, drift=0.8, ref_drift=0.3, empty_row=True)
    loss_and_grad(ours, inputs)
    logps = model_logps(ours, inputs)
    mask = inputs["completion_mask"].bool()
    out = gmpo_loss(
        logps, inputs["old_per_token_logps"], inputs["advantages"], mask, dual_clip=2.0,
        beta=0.05, ref_logp=inputs["ref_per_token_logps"], impl="plain",
    )  # fmt: skip
    got = last_metrics(ours)
    for key, value in out.metrics.items():
        assert got[key] == pytest.approx(float(value), rel=1e-6, abs=1e-9), key
    r = torch.where(mask, logps - inputs["old_per_token_logps"], float("nan"))
    assert got["log_ratio/min"] == pytest.approx(float(r.nan_to_num(1e9).min()), rel=1e-6)
    assert got["log_ratio/max"] == pytest.approx(float(r.nan_to_num(-1e9).max()), rel=1e-6)
    assert got["clip_ratio/region_mean"] > 0


def test_eval_mode_has_no_accumulation_scaling(tmp_path):
    ours = make_trainer(tmp_path)
    inputs = make_inputs(ours, drift=0.5)
    train_loss, _ = loss_and_grad(ours, inputs, accumulation=4)
    ours.model.eval()
    with torch.no_grad():
        eval_loss = ours._compute_loss(ours.model, dict(inputs))
    assert_same(eval_loss, 4 * train_loss)
    assert "clip_ratio/low_mean" in last_metrics(ours, "eval")


def test_gmpo_trainer_is_a_grpo_trainer():
    assert issubclass(GMPOTrainer, GRPOTrainer)
    assert "_compute_loss" in GMPOTrainer.__dict__


def test_compiled_path_matches_plain(tmp_path):
    """gmpo_impl="compiled" (the opt-in torch.compile path)."""
    eager = make_trainer(tmp_path)
    compiled = make_trainer(tmp_path, gmpo_impl="compiled")
    inputs = make_inputs(eager, drift=0.5, empty_row=True, zero_advantage=True)
    loss, grad = loss_and_grad(eager, inputs)
    c_loss, c_grad = loss_and_grad(compiled, inputs)
    torch.testing.assert_close(c_loss, loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c_grad, grad, rtol=1e-5, atol=1e-6)
    assert last_metrics(compiled) == pytest.approx(last_metrics(eager), rel=1e-5, abs=1e-7)


def test_bf16_log_probs_are_computed_in_float32(tmp_path):
    """bf16=True: the forward runs under bf16 autocast; gmpo_core computes the loss in float32
    (docs/semantics.md S8), so it stays close to the float32 run."""
    ours = make_trainer(tmp_path, bf16=True)
    inputs = make_inputs(ours, drift=0.5)
    loss, grad = loss_and_grad(ours, inputs)
    f32_loss, f32_grad = loss_and_grad(make_trainer(tmp_path), inputs)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, f32_loss, rtol=1e-2, atol=1e-3)
    assert (grad - f32_grad).abs().max() < 2e-2 * f32_grad.abs().max()


def test_gmpo_lm_head_matches_trls_chunked_head(tmp_path):
    """gmpo_lm_head=True: gmpo_core.token_logprobs scores the tokens instead of TRL's
    ChunkedLogProbFunction; loss, gradients and metrics (entropy included) are the same."""
    import trl

    from gmpo_trl import compat
    from gmpo_trl import head_swap as lm_head

    if (reason := compat.chunked_head_unsupported()) is not None:  # it warns (test_lm_head_default)
        pytest.skip(f"trl {trl.__version__} lacks trl 1.16's chunked LM head: {reason}")
    calls = []
    original = lm_head.token_logprobs

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs.get("compute_entropy"))
        return original(*args, **kwargs)

    trl_head = make_trainer(tmp_path, beta=0.04, entropy_coef=0.01, gmpo_lm_head=False)
    ours = make_trainer(tmp_path, beta=0.04, entropy_coef=0.01, gmpo_lm_head=True)
    inputs = make_inputs(trl_head, drift=0.5, ref_drift=0.3, empty_row=True, zero_advantage=True)
    loss, grad = loss_and_grad(trl_head, inputs)
    lm_head.token_logprobs = counting
    try:
        our_loss, our_grad = loss_and_grad(ours, inputs)
    finally:
        lm_head.token_logprobs = original
    assert calls and all(calls)  # our head ran, with entropies, for the loss step
    torch.testing.assert_close(our_loss, loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(our_grad, grad, rtol=1e-4, atol=1e-6)
    assert last_metrics(ours) == pytest.approx(last_metrics(trl_head), rel=1e-4, abs=1e-6)
    import trl.trainer.utils as trl_utils
    from trl.kernels import ChunkedLogProbFunction

    assert trl_utils._ChunkedLogProbFunction is ChunkedLogProbFunction  # restored after the call
