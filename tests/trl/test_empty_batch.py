"""An empty batch (B = 0) through GMPOTrainer's loss step: the loss is 0, as gmpo_core's is
(docs/semantics.md S4), also where the KL reads the host's mask apart from the policy term.

TRL's own forward pass refuses B = 0 (``range()`` with a step of 0), so the forward is replaced
by one that returns empty log-probs with a graph: what reaches ``_compute_loss``'s loss code is
what a host that splits a batch unevenly could hand it.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

import torch

from tests.trl._support import last_metrics, make_trainer

pytestmark = pytest.mark.trl

T = 4
# config overrides: the KL inside the core; apart, over the host mask (off-policy or entropy mask)
CASES = {
    "kl in the core": {"beta": 0.05},
    "off-policy mask": {"beta": 0.05, "off_policy_mask_threshold": 0.05},
    "entropy mask": {"beta": 0.05, "top_entropy_quantile": 0.5},
}


def _empty_inputs() -> dict[str, torch.Tensor]:
    ints, floats = torch.zeros(0, T, dtype=torch.long), torch.zeros(0, T)
    return {
        "prompt_ids": torch.zeros(0, 3, dtype=torch.long),
        "prompt_mask": torch.zeros(0, 3, dtype=torch.long),
        "completion_ids": ints,
        "completion_mask": ints,
        "advantages": torch.zeros(0),
        "old_per_token_logps": floats,
        "ref_per_token_logps": floats,
        "sampling_per_token_logps": floats,
    }


@pytest.mark.parametrize("case", list(CASES))
def test_empty_batch_gives_a_zero_loss(tmp_path, case):
    """Regression: with the KL over the host mask (entropy or off-policy mask, beta > 0), the row
    mean was ``Tensor.mean`` of no rows: NaN, where the core gives 0."""
    trainer = make_trainer(tmp_path, **CASES[case])
    logp = torch.zeros(0, T, requires_grad=True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp * 1, torch.zeros(0, T), None)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(trainer.model, _empty_inputs())
    assert loss.item() == 0.0
    loss.backward()
    assert logp.grad is not None and logp.grad.shape == (0, T)
    metrics = last_metrics(trainer)
    assert math.isnan(metrics["kl"]) and math.isnan(metrics["entropy"])  # no token: no value
    assert metrics["clip_ratio/region_mean"] == 0.0
