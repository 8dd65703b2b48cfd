"""verl's policy loss on the ``meta`` device: device-generic without a GPU.

Called as verl's actor (``workers/utils/losses.py::ppo_loss``) calls it: by keyword, once per
micro-batch, with verl's own ``FSDPActorConfig`` and its ``global_batch_info``. On meta tensors a
host read or a CPU constant raises, so each call running to the end, with exactly one read of
its metrics to the host (intercepted by :class:`tests._host_reads.HostReads`), proves that the
adapter makes one host-device synchronization per call and no other.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl")

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn

import gmpo_verl
from tests._host_reads import HostReads
from tests.verl.conftest import actor_config_factory

pytestmark = pytest.mark.verl

B, T = 4, 6
N_METRICS = {"gmpo": 8, "gmpo_dual_clip": 9}  # the values stacked into the one read


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    gmpo_verl.register()


def _meta_batch(dtype: torch.dtype, weights: bool) -> dict[str, Any]:
    meta = {"device": "meta"}
    batch: dict[str, Any] = {
        "old_log_prob": torch.empty(B, T, dtype=torch.float32, **meta),
        "log_prob": torch.empty(B, T, dtype=dtype, **meta, requires_grad=True),
        "advantages": torch.empty(B, T, dtype=torch.float32, **meta),
        "response_mask": torch.empty(B, T, dtype=torch.int64, **meta),  # verl's mask: 0/1 ints
    }
    batch["rollout_is_weights"] = torch.empty(B, T, **meta) if weights else None
    return batch


@pytest.mark.parametrize("weights", [False, True], ids=["no-weights", "weights"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("loss_agg_mode", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("loss_mode", ["gmpo", "gmpo_dual_clip"])
def test_policy_loss_on_meta_reads_the_host_once_per_call(
    loss_mode: str, loss_agg_mode: str, dtype: torch.dtype, weights: bool
) -> None:
    config = actor_config_factory()(
        loss_mode=loss_mode, loss_agg_mode=loss_agg_mode, clip_ratio_c=3.0,
        info={"dp_size": 2, "global_batch_size": 4 * B, "batch_num_tokens": 4 * B * T,
              "loss_scale_factor": None},
    )  # fmt: skip
    fn = get_policy_loss_fn(loss_mode)
    batch = _meta_batch(dtype, weights)
    with HostReads() as reads:
        for call in range(2):  # two micro-batches of one mini-batch
            loss, metrics = fn(**batch, loss_agg_mode=loss_agg_mode, config=config)
            assert reads.calls == [("tolist", (N_METRICS[loss_mode],))] * (call + 1)
            assert loss.is_meta and loss.shape == () and loss.requires_grad
            loss.backward()
    assert batch["log_prob"].grad.is_meta and batch["log_prob"].grad.dtype == dtype
    expected = {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    assert expected <= set(metrics)
    assert ("actor/pg_clipfrac_dual" in metrics) == (loss_mode == "gmpo_dual_clip")
    assert all(isinstance(v, float) for v in metrics.values())
