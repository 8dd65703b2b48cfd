"""One record per host: its names for gmpo_core's options, and how it gives its advantages.

An adapter declares its host once (``HostOptions(host="gmpo_verl", epsilon="clip_ratio_low",
...)``); the core's rules are then checked under the host's names, and the host's advantages are
reduced to the one per sequence that :func:`gmpo_core.gmpo_loss` takes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gmpo_core.options import IMPLS, Impl, check_hyperparameters, check_impl

if TYPE_CHECKING:
    from gmpo_kit.states import MetricStates, Reduced

#: the max states :meth:`HostOptions.advantages` adds for per-token advantages: the largest
#: deviation of a valid token's advantage from its row's mean, and the largest |advantage|
SPREAD, SCALE = "advantages/spread", "advantages/scale"
#: relative tolerance above which per-token advantages are said to vary within a row
SPREAD_RTOL = 1e-5


@dataclass(frozen=True)
class HostOptions:
    """How a host names :func:`gmpo_core.gmpo_loss`'s options and gives its inputs.

    Attributes:
        host: the host adapter's name in errors (``"GMPOTrainer"``).
        epsilon, epsilon_high, dual_clip: the host's names for the loss's ``epsilon``,
            ``epsilon_high`` and ``dual_clip`` (GMPOConfig's ``delta``, verl's ``clip_ratio_c``).
        impl: the host's name for the loss's ``impl`` (the core's path).
        mask: the host's name for its mask of valid tokens.
        token_advantages: the host gives one advantage per token, (B, T), reduced to their mean
            over the row's valid tokens (verl); otherwise one per sequence, (B,) or (B, 1) (TRL).
    """

    host: str
    epsilon: str = "epsilon"
    epsilon_high: str = "epsilon_high"
    dual_clip: str = "dual_clip"
    impl: str = "impl"
    mask: str = "mask"
    token_advantages: bool = False

    def check(
        self, epsilon: object, epsilon_high: object | None, dual_clip: object | None = None
    ) -> tuple[float, float, float | None]:
        """gmpo_core's rules for the clip range (``check_hyperparameters``), its errors naming
        the host's fields; returns ``(eps_low, eps_high, log_dual_clip)``."""
        names = (self.epsilon, self.epsilon_high, self.dual_clip)
        return check_hyperparameters(epsilon, epsilon_high, dual_clip, names=names)

    def check_impl(self, impl: object | None) -> Impl:
        """gmpo_core's rule for ``impl``, its error naming the host's option; None: the
        default path."""
        return check_impl(IMPLS[0] if impl is None else impl, name=self.impl)

    def advantages(
        self,
        advantages: Tensor,
        valid: Tensor,
        tokens: Tensor | None = None,
        states: MetricStates | None = None,
    ) -> Tensor:
        """The host's advantages as one per sequence. A (B,) tensor is returned as is.

        One per sequence (``token_advantages`` False): a (B, 1) tensor is squeezed; any other
        shape is refused. Per token: a (B, T) tensor of ``valid``'s shape becomes its mean over
        the row's valid tokens (0 for a row without any): outcome estimators (GRPO, RLOO, ...)
        broadcast one value over the row, so the mean is that value. With ``states``, how far
        they vary within rows is added as the max states :data:`SPREAD` and :data:`SCALE` (0
        where the advantages are (B,)), read with the metrics (:func:`varies_within_rows`).

        Shape:
            advantages: (B,), (B, 1) or (B, T). valid: (B, T) bool. tokens: (B,),
            ``valid.sum(-1)`` where the caller has it. Output: (B,).
        """
        if not self.token_advantages:
            if advantages.dim() == 2 and advantages.shape[1] == 1:
                advantages = advantages.squeeze(1)
            if advantages.dim() != 1:
                raise ValueError(
                    f"{self.host} needs one advantage per sequence, shape (B,); got "
                    f"{tuple(advantages.shape)}"
                )
            return advantages
        row = advantages
        if advantages.dim() != 1:
            if advantages.shape != valid.shape:
                raise ValueError(
                    f"advantages must have the shape of {self.mask} {tuple(valid.shape)} (or be "
                    f"(B,)), got {tuple(advantages.shape)}"
                )
            n = valid.sum(-1) if tokens is None else tokens
            row = torch.where(valid, advantages, 0).sum(-1) / n.clamp(min=1).to(advantages.dtype)
        if states is not None:
            spread = scale = valid.new_zeros((), dtype=torch.float32)
            if advantages.dim() == 2 and advantages.numel() > 0:
                a = advantages.detach()
                spread = torch.where(valid, (a - row.detach()[:, None]).abs(), 0).amax()
                scale = torch.where(valid, a.abs(), 0).amax()
            states.max(SPREAD, spread)
            states.max(SCALE, scale)
        return row


def spread_values(reduced: Reduced) -> dict[str, Tensor]:
    """The reduced :data:`SPREAD` and :data:`SCALE`, for :func:`gmpo_kit.read`."""
    return {SPREAD: reduced[SPREAD], SCALE: reduced[SCALE]}


def varies_within_rows(host: Mapping[str, float]) -> bool:
    """Whether the advantages read (:data:`SPREAD`, :data:`SCALE`) vary within a row by more
    than :data:`SPREAD_RTOL` of their scale: GMPO then uses their row mean, and the host should
    say so."""
    spread = host[SPREAD]
    return not math.isfinite(spread) or spread > SPREAD_RTOL * (1.0 + host[SCALE])
