"""The variants ``dapo_trl`` and ``cispo_trl`` (gmpo_variants.trl_defaults) are TRL's: same loss
and same gradient as GRPOTrainer's own loss step on one batch, at ``GRPOConfig``'s defaults for
``loss_type="dapo"`` (``epsilon`` and ``epsilon_high`` not passed) and at ``epsilon_high=5.0``
for ``loss_type="cispo"``.

TRL's side runs ``GRPOTrainer._compute_loss`` (tests/trl/_support) on hand-made inputs whose old
log-probs drift from the model's, so the clip acts; ``num_items_in_batch`` is the batch's valid
token count (one accumulation window holding the batch, as tests/variants/test_hosts.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch

from gmpo_variants import VARIANTS
from gmpo_variants.trl_defaults import CISPO_CAP, DAPO_EPSILON, dapo_trl_loss
from tests.trl._support import (
    GRPOConfig,
    GRPOTrainer,
    loss_and_grad,
    make_inputs,
    make_trainer,
    variant_step,
)

pytestmark = pytest.mark.trl


def _ours(trainer: Any, inputs: dict[str, Any], name: str) -> tuple[torch.Tensor, ...]:
    """The variant on the trainer's own log-probs: loss, clipped fraction, flat gradient,
    log-probs."""
    return variant_step(trainer, inputs, VARIANTS[name])


def _inputs(trainer: Any, **spec: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = make_inputs(trainer, rows=16, length=8, **spec)
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    return inputs


def test_dapo_trl_is_trls_default_loss(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, GRPOTrainer, GRPOConfig, beta=0.0)
    assert trainer.loss_type == "dapo"  # GRPOConfig's default loss, at its default epsilons
    assert (trainer.epsilon_low, trainer.epsilon_high, trainer.args.delta) == (0.2, 0.2, None)
    assert DAPO_EPSILON == trainer.epsilon_low
    inputs = _inputs(trainer, seed=2, drift=0.8, zero_advantage=True, empty_row=True)
    trl_loss, trl_grad = loss_and_grad(trainer, inputs)
    loss, clipped, grad, logps = _ours(trainer, inputs, "dapo_trl")
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-4, atol=1e-7)

    mask = inputs["completion_mask"].bool()
    rho, a = torch.exp(logps - inputs["old_per_token_logps"]), inputs["advantages"][:, None]
    want = (mask & (((a > 0) & (rho > 1.2)) | ((a < 0) & (rho < 0.8)))).sum() / mask.sum()
    assert 0 < float(want) < 1  # the clip acts on this batch
    torch.testing.assert_close(clipped, want.float(), rtol=1e-6, atol=0.0)
    # the check can fail: the clip-higher of DAPO's paper (0.28) is another loss on this batch
    wider = dapo_trl_loss(logps, inputs["old_per_token_logps"], inputs["advantages"],
                          inputs["completion_mask"], epsilon_high=0.28)  # fmt: skip
    assert not torch.isclose(wider, trl_loss, rtol=1e-4)


def test_the_cap_is_what_trls_documentation_recommends() -> None:
    import dataclasses

    (field,) = [f for f in dataclasses.fields(GRPOConfig) if f.name == "epsilon_high"]
    help_text = " ".join(field.metadata["help"].split())
    assert "loss_type='cispo'" in help_text
    assert f"recommended value is `{CISPO_CAP}`" in help_text


def test_cispo_trl_is_trls_cispo_at_the_documented_cap(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path, GRPOTrainer, GRPOConfig, beta=0.0, loss_type="cispo", epsilon_high=CISPO_CAP
    )
    inputs = _inputs(trainer, seed=4, drift=1.5, zero_advantage=True)
    trl_loss, trl_grad = loss_and_grad(trainer, inputs)
    loss, clipped, grad, logps = _ours(trainer, inputs, "cispo_trl")
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-4, atol=1e-7)

    mask = inputs["completion_mask"].bool()
    rho, a = torch.exp(logps - inputs["old_per_token_logps"]), inputs["advantages"][:, None]
    assert bool((mask & (rho < 0.8)).any())  # no floor: verl's would clamp these
    capped = mask & (rho > CISPO_CAP) & (a > 0)
    assert int(capped.sum()) > 0  # the cap acts on this batch
    torch.testing.assert_close(clipped, (capped.sum() / mask.sum()).float(), rtol=1e-6, atol=0.0)
    # TRL's CISPO with epsilon_high unset caps every weight at epsilon, 0.2: another loss
    unset = make_trainer(tmp_path / "unset", GRPOTrainer, GRPOConfig, beta=0.0, loss_type="cispo")
    assert unset.epsilon_high == 0.2
    assert not torch.isclose(loss_and_grad(unset, inputs)[0], trl_loss, rtol=1e-3)
