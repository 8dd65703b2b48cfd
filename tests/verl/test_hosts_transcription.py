"""benchmarks/_hosts.py's transcription of verl's ``compute_policy_loss_geo_mean`` is verl's
function: same loss, same gradient, same metrics, on inputs where every branch acts (both clip
sides, rollout weights, a fully masked row, NaN-free padding as verl's actor passes it).

The GPU machine has no verl, so the loss benchmark runs the transcription; this test is what
makes its ``verl`` row verl's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("verl")

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_geo_mean

pytestmark = pytest.mark.verl

HOSTS = Path(__file__).resolve().parents[2] / "benchmarks" / "_hosts.py"


def _hosts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gmpo_bench_hosts", HOSTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inputs(seed: int, weights: bool) -> dict[str, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    lengths = torch.tensor([9, 4, 0, 1, 7, 9])
    mask = (torch.arange(t) < lengths[:, None]).float()
    logp = -torch.rand(b, t, generator=g) * 2
    old = logp + 0.6 * torch.randn(b, t, generator=g)  # beyond the 0.4 bounds on both sides
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3, 0.0, 2.0])[:, None] * mask
    w = torch.exp(0.3 * torch.randn(b, t, generator=g)) if weights else None
    return {"old_log_prob": old, "log_prob": logp, "advantages": adv, "response_mask": mask,
            "rollout_is_weights": w}  # fmt: skip


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("clip", [(0.4, 0.4), (0.2, 0.3)])
def test_transcription_is_verls_function(weights: bool, clip: tuple[float, float]) -> None:
    hosts = _hosts()
    x = _inputs(seed=3, weights=weights)
    config = hosts.verl_config(6, int(x["response_mask"].sum()))  # type: ignore[arg-type]
    config.clip_ratio_low, config.clip_ratio_high = clip
    results = []
    for fn in (compute_policy_loss_geo_mean, hosts.verl_geo_mean_loss):
        logp = x["log_prob"].clone().requires_grad_()  # type: ignore[union-attr]
        loss, metrics = fn(**{**x, "log_prob": logp}, loss_agg_mode="token-mean", config=config)
        loss.backward()
        results.append((loss.detach(), logp.grad, metrics))
    (loss, grad, metrics), (t_loss, t_grad, t_metrics) = results
    torch.testing.assert_close(t_loss, loss, rtol=0, atol=0)
    torch.testing.assert_close(t_grad, grad, rtol=0, atol=0)
    assert t_metrics == metrics
    assert metrics["actor/pg_clipfrac"] > 0 and metrics["actor/pg_clipfrac_lower"] > 0
    assert grad.abs().max() > 0
