"""GRPOTrainer instrumented with the token log-ratio range, for ``gmpo compare``.

GRPOTrainer does not log the range of ``r = logp - old_logp``; this subclass adds
``log_ratio/min`` and ``log_ratio/max`` (from :func:`gmpo_core.clip_metrics`, reduced across
processes) and changes nothing else, so GRPO and GMPO are plotted from the same metric.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from trl import GRPOTrainer

from gmpo_core import clip_metrics
from gmpo_trl import vllm_cpu
from gmpo_trl.trainer import completion_tokens


class RangeLoggingGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` plus the ``log_ratio/min`` / ``log_ratio/max`` metrics."""

    _last_logps: Tensor | None = None

    def __init__(self, model: Any, reward_funcs: Any, args: Any = None, **kwargs: Any) -> None:
        if args is not None:
            vllm_cpu.prepare(model, args)  # use_vllm: as GMPOTrainer, before the engine
        super().__init__(model, reward_funcs, args=args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self._last_logps = out[0]
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        loss = super()._compute_loss(model, inputs)
        if self._last_logps is None:  # set by the forward the loss step just ran
            raise RuntimeError("GRPOTrainer._compute_loss ran no forward pass")
        logps = self._last_logps.detach()
        old = inputs.get("old_per_token_logps")
        mask = completion_tokens(inputs)  # (B, T)
        r = torch.zeros_like(logps) if old is None else logps - old
        stats = clip_metrics(r, inputs["advantages"].reshape(-1), mask)
        extrema = torch.stack([stats.log_ratio_min, -stats.log_ratio_max]).float()
        lo, neg_hi = self.accelerator.gather(extrema.unsqueeze(0)).amin(0).tolist()
        mode = "train" if self.model.training else "eval"
        if abs(lo) != float("inf"):
            self._metrics[mode]["log_ratio/min"].append(lo)
            self._metrics[mode]["log_ratio/max"].append(-neg_hi)
        return loss
