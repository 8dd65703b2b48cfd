"""GMPOTrainer's loss step: one test per honoured feature, differential tests against TRL's own
``trl.experimental.gmpo.GMPOTrainer``, and the on-policy equality with ``GRPOTrainer``.

Every comparison runs two trainers on copies of the same tiny model (same seed) and the same
hand-made inputs, and compares the loss value and the gradient of every parameter.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch
from trl.experimental.gmpo import GMPOConfig as TrlGMPOConfig
from trl.experimental.gmpo import GMPOTrainer as TrlGMPOTrainer

from gmpo_core import gmpo_loss, sequence_kl
from tests.trl._support import (
    IS_MODES,
    GRPOConfig,
    GRPOTrainer,
    assert_same,
    enable_is,
    expected_loss,
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
# differential: TRL's GMPO, where both implement the feature
# --------------------------------------------------------------------------------------------

SHARED = {
    "plain": ({}, {"drift": 0.5}),
    "asymmetric clip": ({"epsilon": 0.2, "epsilon_high": 0.3}, {"drift": 0.5}),
    "beta": ({"beta": 0.05}, {"drift": 0.5, "ref_drift": 0.3}),
    "entropy quantile": ({"top_entropy_quantile": 0.5}, {"drift": 0.5}),
    "entropy quantile + beta": (
        {"top_entropy_quantile": 0.5, "beta": 0.05},
        {"drift": 0.5, "ref_drift": 0.3},
    ),
    "tool mask": ({}, {"drift": 0.5, "tool_mask": True}),
    "zero advantage": ({}, {"drift": 0.5, "zero_advantage": True}),
    "on-policy": ({}, {}),
}


@pytest.mark.parametrize("name", list(SHARED))
def test_matches_trl_gmpo(tmp_path, name):
    config, spec = SHARED[name]
    ours = make_trainer(tmp_path, **config)
    trl_kwargs = {k: v for k, v in config.items()}
    theirs = make_trainer(tmp_path, TrlGMPOTrainer, TrlGMPOConfig, **trl_kwargs)
    inputs = inputs_of(ours, spec)
    loss, grad = loss_and_grad(ours, inputs)
    trl_loss, trl_grad = loss_and_grad(theirs, inputs)
    assert_same(loss, trl_loss)
    assert_same(grad, trl_grad)
    assert grad.abs().max() > 0
    mine, trls = last_metrics(ours), last_metrics(theirs)
    keys = ["entropy", "kl"]
    if "top_entropy_quantile" not in config:  # TRL counts clips over all tokens, we over the
        keys += [k for k in trls if k.startswith("clip_ratio/")]  # policy term's tokens
    for key in keys:
        if key in trls:
            assert mine[key] == pytest.approx(trls[key], rel=1e-6, abs=1e-9), key


def test_empty_row_differs_from_trl_in_value_only(tmp_path):
    """TRL's GMPO gives an empty row coef exp(0) = 1, so it adds -A/B to the loss value (a
    documented difference); the gradient is the same."""
    ours = make_trainer(tmp_path)
    theirs = make_trainer(tmp_path, TrlGMPOTrainer, TrlGMPOConfig)
    inputs = make_inputs(ours, drift=0.5, empty_row=True)
    loss, grad = loss_and_grad(ours, inputs)
    trl_loss, trl_grad = loss_and_grad(theirs, inputs)
    a_empty, rows = inputs["advantages"][1], inputs["advantages"].numel()
    assert_same(trl_loss, loss - a_empty / rows)
    assert abs(float(a_empty)) > 0.1  # the difference is visible
    assert_same(grad, trl_grad)


# --------------------------------------------------------------------------------------------
# features TRL's GMPO drops: ours equals gmpo_core on them, TRL's ignores them
# --------------------------------------------------------------------------------------------


def _trl_ignores(tmp_path, inputs, setup, base=None, **feature):
    """TRL's GMPO gives the same loss with and without the feature (on top of ``base``)."""
    base = base or {}
    theirs = make_trainer(tmp_path, TrlGMPOTrainer, TrlGMPOConfig, **base, **feature)
    setup(theirs)
    plain = make_trainer(tmp_path, TrlGMPOTrainer, TrlGMPOConfig, **base)
    loss, _ = loss_and_grad(theirs, inputs)
    plain_loss, _ = loss_and_grad(plain, inputs)
    assert_same(loss, plain_loss)  # the feature changed nothing in TRL's GMPO


def test_delta_is_the_dual_clip(tmp_path):
    ours = make_trainer(tmp_path, delta=1.5)
    inputs = make_inputs(ours, drift=1.0)
    loss, _ = loss_and_grad(ours, inputs)
    assert_same(loss, expected_loss(ours, inputs, dual_clip=1.5))
    without, _ = loss_and_grad(make_trainer(tmp_path), inputs)
    assert not torch.allclose(loss, without)  # the cap acts on these inputs
    metrics = last_metrics(ours)
    assert metrics["clip_ratio/dual_mean"] > 0
    _trl_ignores(tmp_path, inputs, lambda t: None, delta=1.5)


@pytest.mark.parametrize("mode", IS_MODES)
def test_vllm_importance_sampling_modes(tmp_path, mode):
    """The ratios reach gmpo_core as is_weights (docs/semantics.md S7): (B, 1) weights a row, (B, T)
    enters as its geometric mean, and a zero token weight (token_mask) removes the token from
    the row, its KL included."""
    ours = make_trainer(tmp_path, beta=0.05)
    enable_is(ours, mode)
    inputs = make_inputs(ours, drift=0.3, ref_drift=0.3)
    ratio = is_ratio(inputs, mode)
    assert (ratio == 0).any() == mode.endswith("mask")
    inputs["importance_sampling_ratio"] = ratio
    loss, _ = loss_and_grad(ours, inputs)
    ref = inputs["ref_per_token_logps"]
    assert_same(loss, expected_loss(ours, inputs, is_weights=ratio, beta=0.05, ref_logp=ref))
    no_is, _ = loss_and_grad(make_trainer(tmp_path, beta=0.05), inputs)
    assert not torch.allclose(loss, no_is)
    if mode == "token_mask":  # removing the zero-weight tokens from the mask gives the same loss
        kept = inputs["completion_mask"].bool() & (ratio != 0)
        same = expected_loss(
            ours, inputs, mask=kept, is_weights=ratio.masked_fill(ratio == 0, 1.0), beta=0.05,
            ref_logp=ref,
        )  # fmt: skip
        assert_same(loss, same)
    _trl_ignores(tmp_path, inputs, lambda t: enable_is(t, mode), base={"beta": 0.05})


def test_off_policy_mask_drops_rows_from_the_policy_term_only(tmp_path):
    """GRPOTrainer.get_off_policy_mask drops negative-advantage rows that drifted too far; as in
    GRPOTrainer, the dropped rows keep their KL term."""
    ours = make_trainer(tmp_path, off_policy_mask_threshold=0.05, beta=0.05)
    inputs = make_inputs(ours, drift=0.3, ref_drift=0.3)
    g = torch.Generator().manual_seed(5)
    logps = model_logps(ours, inputs)
    inputs["sampling_per_token_logps"] = logps + 0.6 * torch.rand(logps.shape, generator=g)
    mask = inputs["completion_mask"].bool()
    keep = GRPOTrainer.get_off_policy_mask(
        inputs["advantages"].unsqueeze(1), logps, inputs["sampling_per_token_logps"],
        mask.float(), 0.05,
    ).bool()  # fmt: skip
    assert not keep.all() and keep.any()  # some rows dropped, some kept
    loss, _ = loss_and_grad(ours, inputs)
    policy = gmpo_loss(
        logps, inputs["old_per_token_logps"], inputs["advantages"], mask & keep, impl="plain"
    ).per_sequence_loss
    kl = sequence_kl(logps, inputs["ref_per_token_logps"], mask)
    assert_same(loss, (policy + 0.05 * kl).mean())
    _trl_ignores(
        tmp_path, inputs, lambda t: None, base={"beta": 0.05}, off_policy_mask_threshold=0.05
    )


def test_entropy_bonus(tmp_path):
    ours = make_trainer(tmp_path, entropy_coef=0.1)
    inputs = make_inputs(ours, drift=0.5)
    loss, _ = loss_and_grad(ours, inputs)
    base, _ = loss_and_grad(make_trainer(tmp_path), inputs)
    mask = inputs["completion_mask"].bool()
    metrics = last_metrics(ours)
    entropy = metrics["entropy"]  # token mean over the batch's valid tokens
    assert float(loss - base) == pytest.approx(-0.1 * entropy, rel=1e-5)
    assert metrics["entropy_coef"] == 0.1 and "policy_loss" in metrics
    assert mask.any()
    _trl_ignores(tmp_path, inputs, lambda t: None, entropy_coef=0.1)


def test_liger_flag_leaves_the_loss_unchanged(tmp_path, monkeypatch):
    """In trl 1.16 use_liger_kernel only patches model layers (transformers' apply_liger_kernel,
    with fused_linear_cross_entropy forced off); the loss step is untouched. Liger itself needs
    a GPU: the patch is recorded, not applied. A TRL whose GRPOTrainer replaces the loss with
    Liger's (compute_liger_loss: trl 1.10 to 1.12) is refused instead of training GRPO."""
    import transformers.trainer as hf_trainer

    if hasattr(GRPOTrainer, "compute_liger_loss"):
        with pytest.raises(ValueError, match=r"use_liger_kernel=True: trl \S+'s GRPOTrainer"):
            make_trainer(tmp_path, use_liger_kernel=True)
        return

    calls = []
    monkeypatch.setattr(hf_trainer, "apply_liger_kernel", lambda m, c: calls.append(c))
    with pytest.warns(FutureWarning, match="use_liger_kernel"):
        ours = make_trainer(tmp_path, use_liger_kernel=True)
    assert ours.args.liger_kernel_config["fused_linear_cross_entropy"] is False
    inputs = make_inputs(ours, drift=0.5)
    loss, grad = loss_and_grad(ours, inputs)
    base, base_grad = loss_and_grad(make_trainer(tmp_path), inputs)
    assert_same(loss, base)
    assert_same(grad, base_grad)


def test_forward_inputs_reach_the_model(tmp_path, monkeypatch):
    """Multimodal fields (pixel_values, image_grid_thw, token_type_ids, ...: every optional
    argument of GRPOTrainer._get_per_token_logps_and_entropies) are passed through."""
    from gmpo_trl.trainer import FORWARD_KEYS

    assert {"pixel_values", "image_grid_thw", "num_images", "token_type_ids"} <= set(FORWARD_KEYS)
    ours = make_trainer(tmp_path)
    seen = {}
    original = ours._get_per_token_logps_and_entropies

    def spy(model, ids, attn, keep, **kwargs):
        seen.update(kwargs)
        plain = {k: v for k, v in kwargs.items() if k not in FORWARD_KEYS}
        return original(model, ids, attn, keep, **plain)

    monkeypatch.setattr(ours, "_get_per_token_logps_and_entropies", spy)
    inputs = make_inputs(ours)
    marker = torch.zeros(3)
    inputs["pixel_values"] = marker
    loss_and_grad(ours, inputs)
    assert seen["pixel_values"] is marker and seen["image_grid_thw"] is None
    assert set(FORWARD_KEYS) <= set(seen)


def test_moe_router_aux_loss(tmp_path):
    """The MoE load-balancing loss is added as GRPOTrainer adds it (same value and gradient as
    GRPOTrainer on-policy) and logged as aux_loss."""
    from tests.trl._support import tiny_moe as moe

    ours = make_trainer(tmp_path, model=moe())
    grpo = make_trainer(tmp_path, GRPOTrainer, GRPOConfig, model=moe(), loss_type="grpo")
    assert ours.aux_loss_enabled
    inputs = make_inputs(ours)
    loss, grad = loss_and_grad(ours, inputs)
    grpo_loss, grpo_grad = loss_and_grad(grpo, inputs)
    assert_same(loss, grpo_loss)
    assert_same(grad, grpo_grad)
    aux = last_metrics(ours)["aux_loss"]
    assert aux == pytest.approx(last_metrics(grpo)["aux_loss"]) and aux > 0
    # the coefficient is the host's: the model config's 0.05 where the field defaults to None
    # (trl 1.14.2, 1.16.0), GRPOConfig.router_aux_loss_coef's default 0.001 before (1.10, 1.12)
    coef = ours.router_aux_loss_coef
    assert coef == grpo.router_aux_loss_coef
    default = GRPOConfig.__dataclass_fields__["router_aux_loss_coef"].default
    assert coef == (0.05 if default is None else default)
    theirs = make_trainer(tmp_path, TrlGMPOTrainer, TrlGMPOConfig, model=moe())
    trl_loss, _ = loss_and_grad(theirs, inputs)  # TRL's GMPO drops the aux loss
    assert float(loss - trl_loss) == pytest.approx(coef * aux, rel=1e-4)
