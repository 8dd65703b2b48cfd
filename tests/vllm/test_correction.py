"""TRL's importance-sampling correction through GMPOTrainer, with vLLM's real rollouts: for
``vllm_importance_sampling_correction=False`` and each of TRL's four modes, the weights
``gmpo_loss`` receives are TRL's own (recomputed here from the same log-probs with the formulas of
trl 1.16's ``GRPOTrainer._generate_and_score_completions``), and they enter the loss as
docs/semantics.md S7 states, inside the geometric mean (checked against ``gmpo_core.reference``
on the same inputs, value and gradient). And the loss step of a batch of vLLM's rollouts is the
loss step of a trainer that generates with transformers, given the same completions.

One trainer serves every mode: the mode is an attribute the trainer reads at each generation.
The clip bounds are 1 ± 0.001, inside the spread of bf16 sampling's ratios, so that every mode
changes some weights and leaves others (asserted: a mode that changed nothing would prove
nothing).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch

from gmpo_core import reference
from gmpo_tasks import successor as toy
from gmpo_trl import GMPOConfig, GMPOTrainer
from tests.vllm._support import COMPLETION, TOKENIZER, batch, vllm_args, vllm_trainer

pytestmark = pytest.mark.vllm

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
LO, HI = 0.999, 1.001


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A vLLM trainer after 10 steps (completions of up to 3 tokens), its bounds at 1 ± 0.001."""
    trainer = vllm_trainer(tmp_path_factory.mktemp("corr"), seed=1, max_steps=10,
                           vllm_importance_sampling_clip_min=LO,
                           vllm_importance_sampling_clip_max=HI)  # fmt: skip
    trainer.train()
    return trainer


def trl_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, mode: str) -> Any:
    """TRL 1.16's vLLM importance-sampling ratio (grpo_trainer.py, _generate_and_score_completions):
    exp of the masked log-prob difference, summed over the row in the sequence modes; truncated
    to [C_min, C_max] in the *_truncate modes, set to 0 outside it in the *_mask modes."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=LO, max=HI)
    return ratio.masked_fill((ratio < LO) | (ratio > HI), 0.0)


def run_loss_step(trainer: Any, inputs: dict[str, Any], monkeypatch: Any) -> dict[str, Any]:
    """One training loss step; the arguments and result of the gmpo_loss call it made."""
    import gmpo_kit.kl as module  # the trainer's loss step calls gmpo_loss there

    calls: list[dict[str, Any]] = []
    inner = module.gmpo_loss

    def spy(logp: torch.Tensor, old_logp: Any, advantages: Any, mask: Any, **kw: Any) -> Any:
        out = inner(logp, old_logp, advantages, mask, **kw)
        calls.append(dict(logp=logp, old=old_logp, adv=advantages, mask=mask, out=out, **kw))
        return out

    monkeypatch.setattr(module, "gmpo_loss", spy)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(trainer.model, dict(inputs))
    assert len(calls) == 1
    return {**calls[0], "returned": loss}


def np64(x: Any) -> Any:
    return None if x is None else x.detach().double().numpy()


@pytest.mark.parametrize("mode", [None, *MODES], ids=["correction_off", *MODES])
def test_weights_are_trls_and_enter_the_geometric_mean(trainer, mode, monkeypatch):
    monkeypatch.setattr(trainer, "vllm_importance_sampling_correction", mode is not None)
    monkeypatch.setattr(trainer, "vllm_importance_sampling_mode", mode or "sequence_mask")
    inputs = trainer._generate_and_score_completions(batch(trainer, seed=3))
    call = run_loss_step(trainer, inputs, monkeypatch)
    w = call["is_weights"]
    if mode is None:
        assert "importance_sampling_ratio" not in inputs
        assert w is None
    else:
        mask = inputs["completion_mask"]
        assert mask.shape[1] > 1  # the token modes' weights are (B, T), the sequence ones (B, 1)
        expected = trl_ratio(inputs["old_per_token_logps"], inputs["sampling_per_token_logps"],
                             mask, mode)  # fmt: skip
        assert w.shape == ((mask.shape[0], 1) if mode.startswith("sequence") else mask.shape)
        torch.testing.assert_close(w, expected, rtol=0, atol=0)
        # the mode acted on some weights and left others
        valid = mask.bool().any(-1, keepdim=True) if mode.startswith("sequence") else mask.bool()
        untouched = (w > LO) & (w < HI)
        assert bool((valid & ~untouched).any()) and bool((valid & untouched).any())
    # S7 (docs/semantics.md): the loss GMPOTrainer trained on is the reference's with these weights
    # (row weights multiply the row's term; token weights enter as their geometric mean over the
    # row's valid tokens, a zero weight removes the token), value and gradient
    ref = reference.gmpo_loss(
        np64(call["logp"]), np64(call["old"]), np64(call["adv"]), np64(call["mask"]),
        epsilon=call["epsilon"], epsilon_high=call["epsilon_high"], is_weights=np64(w),
    )  # fmt: skip
    out = call["out"]
    assert math.isclose(float(out.loss.detach()), ref.loss, rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(float(call["returned"].detach()), ref.loss, rel_tol=1e-5, abs_tol=1e-7)
    (grad,) = torch.autograd.grad(out.loss, call["logp"])
    np.testing.assert_allclose(grad.double().numpy(), ref.grad_logp, rtol=1e-4, atol=1e-7)
    if mode == "token_truncate":  # the geometric mean, written out: exp(mean_t (c_t + log w_t))
        valid = call["mask"].bool()
        r = (call["logp"] - call["old"]).double().where(valid, 0.0)
        adv = call["adv"].double()
        c = torch.where(adv[:, None] >= 0, r.clamp(max=call["epsilon_high"]),
                        r.clamp(min=-call["epsilon"]))  # fmt: skip
        n = valid.sum(-1).clamp(min=1)
        log_coef = ((c + w.double().log()) * valid).sum(-1) / n
        rows = torch.where(valid.any(-1), -adv * log_coef.exp(), 0.0)
        assert math.isclose(
            float(out.loss.detach()), float(rows.mean()), rel_tol=1e-5, abs_tol=1e-7
        )


def test_vllm_rollouts_and_transformers_generation_same_loss_step(trainer, tmp_path, monkeypatch):
    """The loss step does not depend on who generated: a batch of vLLM's rollouts (correction
    off) gives the vLLM trainer and a trainer generating with transformers (same weights) the same
    loss and gradient."""
    monkeypatch.setattr(trainer, "vllm_importance_sampling_correction", False)
    inputs = trainer._generate_and_score_completions(batch(trainer, seed=4))
    args = vllm_args(tmp_path, use_vllm=False, seed=1, max_completion_length=COMPLETION)
    hf = GMPOTrainer(
        model=copy.deepcopy(trainer.model),
        reward_funcs=toy.successor_reward,
        args=GMPOConfig(**args),
        train_dataset=toy.successor_dataset(seed=1),
        processing_class=TOKENIZER,
    )
    losses, grads = [], []
    for t in (trainer, hf):
        t.model.train()
        t.model.zero_grad(set_to_none=True)
        t.current_gradient_accumulation_steps = 1
        loss = t._compute_loss(t.model, dict(inputs))
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.reshape(-1) for p in t.model.parameters()]))
    assert float(losses[0]) != 0.0 and bool(grads[0].abs().sum() > 0)
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
