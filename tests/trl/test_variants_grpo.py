"""The variants ``grpo`` and ``grpo_wide`` (gmpo_variants.grpo) are TRL's
``loss_type="grpo"``: same loss and same gradient as GRPOTrainer's own loss step on one batch.

TRL's side runs ``GRPOTrainer._compute_loss`` (its code path, not a transcription of it) on
hand-made inputs whose ``old_per_token_logps`` drift from the model's, so the clip acts; the
study's side gets the trainer's own log-probs and the same old log-probs and advantages.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch

from gmpo_variants import VARIANTS
from tests.trl._support import (
    GRPOConfig,
    GRPOTrainer,
    loss_and_grad,
    make_inputs,
    make_trainer,
    variant_step,
)

pytestmark = pytest.mark.trl

EPSILONS = {
    "grpo": {"epsilon": 0.2},
    "grpo_wide": {"epsilon": -math.expm1(-0.4), "epsilon_high": math.expm1(0.4)},
}


@pytest.mark.parametrize("variant", sorted(EPSILONS))
def test_study_grpo_is_trl_grpo(tmp_path: Path, variant: str) -> None:
    trainer = make_trainer(
        tmp_path, GRPOTrainer, GRPOConfig, loss_type="grpo", beta=0.0, **EPSILONS[variant]
    )
    inputs = make_inputs(trainer, seed=1, rows=8, length=6, drift=0.5, zero_advantage=True)
    trl_loss, trl_grad = loss_and_grad(trainer, inputs)

    loss, clipped, grad, logps = variant_step(trainer, inputs, VARIANTS[variant].loss)

    assert float(clipped) > 0  # the drift makes the clip act, so the bounds are compared too
    torch.testing.assert_close(loss.detach(), trl_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-4, atol=1e-7)
    # the check can fail: GRPO at another clip width gives another loss on this batch
    other = VARIANTS["grpo_wide" if variant == "grpo" else "grpo"].loss(
        logps.detach(), inputs["old_per_token_logps"], inputs["advantages"],
        inputs["completion_mask"],
    )[0]  # fmt: skip
    assert not torch.isclose(other, trl_loss, rtol=1e-4)
