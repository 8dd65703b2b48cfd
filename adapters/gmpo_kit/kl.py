"""The loss where a host's KL reads more tokens than its policy term.

TRL's GRPOTrainer removes low-entropy tokens (``top_entropy_quantile``) and off-policy rows
(``off_policy_mask_threshold``) from the policy term only: its KL keeps every token of the host's
mask. :func:`gmpo_core.gmpo_loss` takes one mask, so there the KL is
:func:`gmpo_core.sequence_kl` over the host's mask, added to the core's per-sequence loss.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from gmpo_core import GMPOOutput, gmpo_loss, sequence_kl


class HostLoss(NamedTuple):
    """What :func:`gmpo_loss_with_kl` returns.

    Shape:
        loss: (). out: the core's output on the policy term's tokens. kl_sum: () or None (no
        KL term). kl_tokens: () the number of tokens the KL reads.
    """

    loss: Tensor
    out: GMPOOutput
    kl_sum: Tensor | None
    kl_tokens: Tensor


def gmpo_loss_with_kl(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    kl_mask: Tensor | None = None,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    is_weights: Tensor | None = None,
    **options: Any,
) -> HostLoss:
    """:func:`gmpo_core.gmpo_loss` on the policy term's tokens ``mask``, with its KL term over
    the host's ``kl_mask`` (None: over ``mask``, computed by the core).

    Where the KL is apart, row i's loss is the core's ``per_sequence_loss[i] + beta * KL_i``,
    ``KL_i`` the token mean of k3 over the row's ``kl_mask`` tokens (:func:`gmpo_core.sequence_kl`),
    less those whose token weight in ``is_weights`` is 0 (they leave the row, as in the core);
    the loss is their :func:`row_mean`. ``options`` are ``gmpo_loss``'s other keywords.

    Shape:
        logp, old_logp, mask, kl_mask, ref_logp: (B, T). advantages: (B,). is_weights: as
        ``gmpo_loss`` takes them.
    """
    # without ref_logp the core refuses beta != 0, in its own words
    apart = kl_mask if beta != 0.0 and ref_logp is not None else None
    out = gmpo_loss(
        logp,
        old_logp,
        advantages,
        mask,
        beta=beta if apart is None else 0.0,
        ref_logp=ref_logp if apart is None else None,
        is_weights=is_weights,
        **options,
    )
    if apart is None or ref_logp is None:
        return HostLoss(out.loss, out, out.kl_sum, out.stats.num_tokens)
    kl_mask = apart
    if is_weights is not None and is_weights.shape == kl_mask.shape:
        kl_mask = kl_mask & (is_weights != 0)  # zero token weights (TRL's token_mask mode)
    kl_rows = sequence_kl(logp, ref_logp, kl_mask)  # (B,)
    loss = row_mean(out.per_sequence_loss + beta * kl_rows)
    n_kl = kl_mask.sum(-1)  # (B,)
    return HostLoss(loss, out, (kl_rows.detach() * n_kl).sum(), n_kl.sum())


def row_mean(rows: Tensor) -> Tensor:
    """The mean over the batch's rows, 0 when there is none (B = 0): the core's ``loss`` of its
    ``per_sequence_loss`` (docs/semantics.md S4).

    Shape:
        rows: (B,). Output: ().
    """
    return rows.sum() / max(rows.shape[0], 1)
