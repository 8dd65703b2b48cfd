"""verl-shaped inputs and calls of the GMPO policy loss, shared by the verl loss tests."""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn

B, T = 8, 12
LENGTHS = [12, 7, 0, 3, 12, 1, 9, 5]  # row 2 is fully masked


def verl_batch(seed: int = 0, weights: bool = True) -> dict[str, torch.Tensor]:
    """verl-shaped inputs: (B, T) advantages constant along each row, NaN in the padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    logp = -torch.rand(B, T, generator=g) * 2
    old = logp + 0.5 * torch.randn(B, T, generator=g)
    adv_rows = torch.tensor([1.0, -1.0, 0.7, -0.5, 0.0, 2.0, -1.5, 0.3])
    adv = adv_rows[:, None].expand(B, T).clone()
    for t in (logp, old, adv):
        t[~mask] = float("nan")  # padding never matters
    batch = {"log_prob": logp, "old_log_prob": old, "advantages": adv, "response_mask": mask}
    if weights:
        w = torch.exp(0.3 * torch.randn(B, T, generator=g))
        w[0, 3] = 0.0  # a dropped token (docs/semantics.md S7)
        batch["rollout_is_weights"] = w
    return batch


def verl_info(batch: dict[str, torch.Tensor], dp_size: int = 1) -> dict[str, Any]:
    """What verl's engine puts in config.global_batch_info for the whole (global) batch."""
    return {
        "dp_size": dp_size,
        "global_batch_size": batch["response_mask"].shape[0],
        "batch_num_tokens": int(batch["response_mask"].sum()),
        "loss_scale_factor": None,
    }


def call_loss(config: Any, rows: slice | list[int], batch: dict[str, torch.Tensor], leaf: torch.Tensor,
          loss_mode: str = "gmpo") -> tuple[torch.Tensor, dict[str, Any]]:  # fmt: skip
    """One micro-batch through the registered loss, called by keyword as verl's ppo_loss does."""
    fn = get_policy_loss_fn(loss_mode)
    part = {k: v[rows] for k, v in batch.items()}
    return fn(
        old_log_prob=part["old_log_prob"], log_prob=leaf[rows], advantages=part["advantages"],
        response_mask=part["response_mask"], loss_agg_mode=config.loss_agg_mode, config=config,
        rollout_is_weights=part.get("rollout_is_weights"),
    )  # fmt: skip


def split_rows(sizes: list[int], start: int = 0) -> list[list[int]]:
    out, i = [], start
    for s in sizes:
        out.append(list(range(i, i + s)))
        i += s
    return out


def loss_and_grad(config: Any, batch: dict[str, torch.Tensor], ranks: list[list[list[int]]],
                   loss_mode: str = "gmpo") -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Sum over each rank's micro-batches, averaged over ranks (FSDP's gradient reduction)."""
    leaf = batch["log_prob"].clone().requires_grad_()
    total = sum(
        call_loss(config, rows, batch, leaf, loss_mode)[0] for micro in ranks for rows in micro
    ) / len(ranks)
    (grad,) = torch.autograd.grad(total, leaf)
    return total.detach(), torch.nan_to_num(grad)
