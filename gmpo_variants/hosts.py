"""The losses users run now, from their host's own code: ``dapo``, ``gspo``, ``cispo`` and
``sapo`` call verl's registered policy losses (``verl.trainer.ppo.core_algos.get_policy_loss_fn``)
as verl's actor calls them (``verl/workers/utils/losses.py::ppo_loss`` in verl 0.8 and 0.9.1),
never a rewrite of them.

Each variant builds verl's ``ActorConfig`` once per process (the settings below, every other
field at verl's default) and, on each call, describes the call's batch in
``config.global_batch_info`` as one whole mini-batch on one rank: ``dp_size`` 1,
``global_batch_size`` B, ``batch_num_tokens`` the number of valid tokens (at least 1: an empty
batch gives 0 where verl's actor would divide 0 by 0), so the loss is the mean over this batch.
The (B,) advantages are broadcast over the mask, as verl's outcome advantage estimators write
them. ``tests/variants/test_hosts.py`` compares each with TRL's loss step of the same
``loss_type`` and states every difference; docs/losses.md gives the settings' sources.

verl is imported on the first call only, so this module imports without it;
``gmpo_variants.resolve`` refuses these variants in one line where verl is not installed. The
shared config is not thread-safe: one call at a time per process, as in verl's actor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gmpo_variants.grpo import ratio_bounds
from gmpo_variants.registry import LossFn, register


@dataclass(frozen=True)
class HostLoss:
    """A verl policy loss and the ``ActorConfig`` fields it runs with (the rest: verl's
    defaults). ``clip``: ``(clip_ratio_low, clip_ratio_high)``; ``taus``: SAPO's
    ``(tau_pos, tau_neg)``. ``label``: the variant's. ``token_clip``: whether ``clip`` is a
    token-level clip that removes gradients (the variant's bounds are then ``clip`` in log
    space)."""

    loss_mode: str
    loss_agg_mode: str
    clip: tuple[float, float]
    label: str
    taus: tuple[float, float] = (1.0, 1.05)
    token_clip: bool = False

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The log-space bounds of the token-level clip, None without one."""
        return ratio_bounds(*self.clip) if self.token_clip else None


#: the settings; ``cispo`` and ``sapo`` are verl's defaults (``ActorConfig``, verl 0.8 to 0.9.1),
#: which tests/variants/test_hosts.py checks against the installed verl. The comments say what
#: each variant's clipped fraction counts (verl's ``pg_clipfrac + pg_clipfrac_lower``).
HOSTS = {
    # PPO's clip with verl's dual clip at clip_ratio_c = 3 for A < 0, DAPO's clip-higher.
    # Clipped: the valid tokens whose gradient a clip removed (A > 0 and ρ > 1.28, A < 0 and
    # ρ < 0.8, A < 0 and ρ > 3)
    "dapo": HostLoss(
        "vanilla", "token-mean", (0.2, 0.28),
        label="DAPO: verl vanilla, token-mean, ratio clip [0.8, 1.28]",
        token_clip=True,
    ),
    # the sequence's geometric-mean ratio clipped, a token mean per sequence, then the mean over
    # the B sequences (GSPO paper v2, §5.1). Clipped: the valid tokens of sequences whose ratio
    # the clip removed from the gradient (no token-level clip: no bounds)
    "gspo": HostLoss(
        "gspo", "seq-mean-token-mean", (3e-4, 4e-4),
        label="GSPO: verl gspo, seq-mean-token-mean, sequence clip [1 - 3e-4, 1 + 4e-4]",
    ),
    # -sg(clip(ρ, 0.8, 1.2))·A·log π per token, token-mean. Clipped: the valid tokens whose
    # importance weight the clip changed; their gradient is kept, scaled by the clipped weight
    # (so no bounds: nothing is removed)
    "cispo": HostLoss(
        "cispo", "token-mean", (0.2, 0.2),
        label="CISPO: verl cispo, token-mean, IS weight clip [0.8, 1.2]",
    ),
    # the soft gate (4/τ)·σ(τ(ρ - 1)), τ 1.0 where A > 0 and 1.05 elsewhere; verl's sapo
    # aggregates seq-mean-token-mean whatever loss_agg_mode says. No clip: the clipped fraction
    # is verl's 0
    "sapo": HostLoss(
        "sapo", "token-mean", (0.2, 0.2), taus=(1.0, 1.05),
        label="SAPO: verl sapo, soft gate, τ+ 1.0, τ- 1.05",
    ),
}  # fmt: skip


@functools.cache
def host_loss(name: str) -> tuple[Any, Any]:
    """``(verl's policy loss function, verl's ActorConfig)`` of the variant ``name``, built once
    per process (the first call imports verl)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig, PolicyLossConfig

    host = HOSTS[name]
    config = ActorConfig(
        strategy="fsdp",  # required fields that the loss does not read
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(loss_mode=host.loss_mode),
        loss_agg_mode=host.loss_agg_mode,
        clip_ratio_low=host.clip[0],
        clip_ratio_high=host.clip[1],
        tau_pos=host.taus[0],
        tau_neg=host.taus[1],
    )
    return get_policy_loss_fn(host.loss_mode), config


def call_host(
    name: str, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """verl's loss ``name`` on one batch, as verl's ``ppo_loss`` calls it: ``(loss, clipped
    fraction)``, the fraction being verl's ``pg_clipfrac + pg_clipfrac_lower`` (0-d, float32).
    verl's functions read their metrics to the host (three ``.item()`` calls a call).

    Shape:
        logp, old_logp, mask: (B, T). advantages: (B,).
    """
    fn, config = host_loss(name)
    valid = mask.bool()  # (B, T), what ppo_loss passes as response_mask
    info = config.global_batch_info
    info["dp_size"] = 1
    info["global_batch_size"] = valid.shape[0]
    info["batch_num_tokens"] = valid.sum().clamp(min=1)  # a tensor: no host read for it
    info["loss_scale_factor"] = config.loss_scale_factor
    loss, metrics = fn(
        old_log_prob=old_logp,
        log_prob=logp,
        advantages=advantages[:, None] * valid,  # (B, T), zero on padding
        response_mask=valid,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=None,
    )
    clipped = metrics["actor/pg_clipfrac"] + metrics["actor/pg_clipfrac_lower"]
    return loss, torch.tensor(clipped, dtype=torch.float32, device=loss.device)


def register_host(name: str) -> LossFn:
    """Register verl's loss ``name`` of :data:`HOSTS` as the variant ``name``, in one
    registration: :func:`call_host` at that name, its label and bounds from its settings.
    Returns the loss."""
    host = HOSTS[name]
    loss = functools.partial(call_host, name)
    return register(name, label=host.label, bounds=host.bounds, requires="verl")(loss)


dapo, gspo, cispo, sapo = map(register_host, HOSTS)

__all__ = ["HOSTS", "HostLoss", "call_host", "cispo", "dapo", "gspo", "host_loss", "sapo"]
