"""GMPOTrainer's loss step on the real model (SmolLM2-135M-Instruct, float32, gmpo's own LM head
on: the default) equals TRL 1.16's own ``trl.experimental.gmpo.GMPOTrainer`` on the same batch:
the loss value and the gradient of every one of the 134,515,008 parameters.

The batch is what GRPOTrainer would hand the loss step: chat_chain_sum prompts rendered by the
model's chat template, completions sampled from the model (``tests.trl._support.chat_inputs``),
old log-probs drifted from the model's own so that the clip acts.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")

import torch
from trl.experimental.gmpo import GMPOConfig as TrlGMPOConfig
from trl.experimental.gmpo import GMPOTrainer as TrlGMPOTrainer

from tests.trl._support import chat_inputs, grad_errors, last_metrics, loss_and_grad, real_trainer

pytestmark = pytest.mark.trl

# Tolerances. Both trainers run the same float32 model on the same batch; the one difference is
# the LM head that scores the tokens (gmpo_core.token_logprobs walks chunks of tokens, TRL's
# chunked head chunks of the vocabulary): the 576-term logits and the 49,152-term log-sum-exp
# are summed in another order, so the log-probs differ by a few float32 ulps, and that difference
# goes back through 30 layers. Measured on
# this batch and the three cases of an earlier version: loss |diff| <= 1.8e-7 (loss ~0.3), gradient relative L2 error <= 1.5e-6 and largest
# element difference <= 1.1e-6 of the largest element. The bounds are about ten times that; the
# two cases' losses on this one batch already differ in the second digit.
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-6
GRAD_REL_L2 = 1e-5  # ||g - g_trl|| / ||g_trl||
GRAD_REL_MAX = 1e-5  # max |g - g_trl| / max |g_trl|, over all 134,515,008 elements


# Two cases (21 s for both on two idle cores): the defaults, and everything else at once.
CASES = {
    "defaults": {},  # epsilon 0.4 both ways, beta 0
    # an asymmetric clip and the KL to the reference log-probs (both load the reference model)
    "asymmetric clip, beta": {"epsilon": 0.2, "epsilon_high": 0.3, "beta": 0.05},
}


@pytest.fixture(scope="module")
def batch(smollm2, tmp_path_factory):
    """One batch for every case: 4 rows, 12 sampled tokens at most, row 1 cut shorter;
    old log-probs = the model's + N(0, 0.5), reference log-probs = the model's + N(0, 0.3)."""
    trainer = real_trainer(tmp_path_factory.mktemp("batch"), smollm2)
    inputs = chat_inputs(trainer, length=12, drift=0.5, ref_drift=0.3)
    lengths = inputs["completion_mask"].sum(1)
    assert lengths.min() < lengths.max() and lengths.min() > 0  # rows of varied lengths
    return inputs


@pytest.mark.parametrize("name", list(CASES))
def test_matches_trl_gmpo_on_the_real_model(smollm2, batch, tmp_path, name):
    config = CASES[name]
    inputs = batch if "beta" in config else {k: v for k, v in batch.items() if "ref" not in k}
    ours = real_trainer(tmp_path, smollm2, **config)
    loss, grad = loss_and_grad(ours, inputs)
    metrics = last_metrics(ours)
    del ours  # one model's weights and gradient at a time beside the other's
    theirs = real_trainer(tmp_path, smollm2, TrlGMPOTrainer, TrlGMPOConfig, **config)
    trl_loss, trl_grad = loss_and_grad(theirs, inputs)
    trl_metrics = last_metrics(theirs)

    assert grad.numel() == trl_grad.numel() == 134_515_008  # every parameter's gradient
    assert trl_grad.abs().max() > 0
    rel_l2, rel_max = grad_errors(grad, trl_grad)
    print(f"{name}: loss {float(loss):.8f} / TRL {float(trl_loss):.8f}, gradient relative L2 "
          f"error {rel_l2:.2e}, largest element difference {rel_max:.2e}")  # fmt: skip
    torch.testing.assert_close(loss, trl_loss, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    assert rel_l2 < GRAD_REL_L2 and rel_max < GRAD_REL_MAX, (rel_l2, rel_max)
    assert metrics["clip_ratio/region_mean"] > 0  # the clip acted
    for key in ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]:
        assert metrics[key] == pytest.approx(trl_metrics[key], rel=1e-6), key
    for key in ["entropy", "kl"] if "beta" in config else ["entropy"]:
        assert metrics[key] == pytest.approx(trl_metrics[key], rel=1e-5), key
