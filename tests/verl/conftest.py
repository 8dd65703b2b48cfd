"""Shared fixtures for the verl adapter tests (every module here skips itself without verl)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def actor_config() -> Callable[..., Any]:
    """A factory of verl's real ``FSDPActorConfig`` (it rejects unknown keys), GMPO's settings by
    default, with ``global_batch_info`` filled as verl's ``ppo_loss`` fills it."""
    return actor_config_factory()


def actor_config_factory() -> Callable[..., Any]:
    """The factory behind the ``actor_config`` fixture (also for Hypothesis tests, which cannot
    take function-scoped fixtures)."""
    workers_config = pytest.importorskip("verl.workers.config")

    def make(
        *,
        loss_mode: str = "gmpo",
        loss_agg_mode: str = "seq-mean-token-mean",
        info: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> Any:
        fields = dict(clip_ratio_low=0.4, clip_ratio_high=0.4) | overrides
        config = workers_config.FSDPActorConfig(
            strategy="fsdp2",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=2,
            policy_loss=workers_config.PolicyLossConfig(loss_mode=loss_mode),
            loss_agg_mode=loss_agg_mode,
            **fields,
        )
        if info is not None:
            config.global_batch_info.update(info)
        return config

    return make
