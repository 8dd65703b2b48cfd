"""Differential tests against verl 0.9.1's own loss_mode=geo_mean: of loss_mode=gmpo (the
adapter), then of ``gmpo_core.gmpo_loss`` itself.

On one micro-batch holding the whole batch, with sequence-level advantages, both compute the
paper's objective: equal loss and gradient. The documented differences are asserted as such:
geo_mean ignores ``global_batch_info`` (its summed gradient grows with the number of micro-batches),
and its clip fractions count tokens the one-sided clip never selects.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("verl")

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_geo_mean, get_policy_loss_fn

import gmpo_verl
from gmpo_core import gmpo_loss
from tests.verl import _versions

pytestmark = pytest.mark.verl

B, T = 6, 20


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    gmpo_verl.register()


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([20, 17, 5, 1, 20, 7])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    logp = -torch.rand(B, T, generator=g) * 2
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 1.5])[:, None] * mask  # verl's GRPO layout
    return {
        "log_prob": logp,
        "old_log_prob": logp + 0.4 * torch.randn(B, T, generator=g),
        "advantages": adv,
        "response_mask": mask,
    }


def _call(fn: Any, config: Any, batch: dict[str, torch.Tensor], rows: list[int],
          leaf: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:  # fmt: skip
    return fn(
        old_log_prob=batch["old_log_prob"][rows], log_prob=leaf[rows],
        advantages=batch["advantages"][rows], response_mask=batch["response_mask"][rows],
        loss_agg_mode=config.loss_agg_mode, config=config,
    )  # fmt: skip


def _grad(fn: Any, config: Any, batch: dict[str, torch.Tensor],
          micro: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    leaf = batch["log_prob"].clone().requires_grad_()
    loss = sum(_call(fn, config, batch, rows, leaf)[0] for rows in micro)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def _config(actor_config: Any, batch: dict[str, torch.Tensor]) -> Any:
    info = {
        "dp_size": 1,
        "global_batch_size": B,
        "batch_num_tokens": int(batch["response_mask"].sum()),
    }
    return actor_config(info=info)


def test_equal_loss_and_gradient_on_one_micro_batch(actor_config) -> None:
    batch = _batch()
    config = _config(actor_config, batch)
    whole = [list(range(B))]
    loss_v, grad_v = _grad(compute_policy_loss_geo_mean, config, batch, whole)
    loss, grad = _grad(get_policy_loss_fn("gmpo"), config, batch, whole)
    torch.testing.assert_close(loss, loss_v, rtol=1e-5, atol=1e-6)
    # verl divides by n + 1e-8 where gmpo_core divides by n: a relative difference of ~1e-8 / n
    torch.testing.assert_close(grad, grad_v, rtol=1e-5, atol=1e-7)
    _, m_v = _call(compute_policy_loss_geo_mean, config, batch, whole[0], batch["log_prob"])
    _, m = _call(get_policy_loss_fn("gmpo"), config, batch, whole[0], batch["log_prob"])
    assert m["actor/ppo_kl"] == pytest.approx(m_v["actor/ppo_kl"], rel=1e-5)


@pytest.mark.parametrize("num_micro", [2, 3])
def test_documented_difference_geo_mean_scales_with_micro_batches(
    actor_config, num_micro: int
) -> None:
    """geo_mean takes a local mean per micro-batch, so the accumulated gradient is ~num_micro times
    the one-batch gradient (exactly, for equal micro-batches); gmpo's does not change."""
    batch = _batch()
    config = _config(actor_config, batch)
    micro = [list(range(i, B, num_micro)) for i in range(num_micro)]  # equal sizes
    _, grad_v1 = _grad(compute_policy_loss_geo_mean, config, batch, [list(range(B))])
    _, grad_vn = _grad(compute_policy_loss_geo_mean, config, batch, micro)
    torch.testing.assert_close(grad_vn, num_micro * grad_v1, rtol=1e-5, atol=1e-7)
    _, grad_1 = _grad(get_policy_loss_fn("gmpo"), config, batch, [list(range(B))])
    _, grad_n = _grad(get_policy_loss_fn("gmpo"), config, batch, micro)
    torch.testing.assert_close(grad_n, grad_1, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_documented_difference_clipfrac_counts_unselected_tokens(actor_config, sign: float) -> None:
    """geo_mean counts A > 0 tokens with r < -eps (and A < 0 tokens with r > eps) as clipped,
    though the one-sided clip never touches them; gmpo counts only tokens it clipped."""
    batch = _batch()
    batch["old_log_prob"] = batch["log_prob"] + sign  # r = -sign: outside [-0.4, 0.4]
    batch["advantages"] = sign * (batch["advantages"].abs() + 0.5) * batch["response_mask"]
    config = _config(actor_config, batch)
    rows = list(range(B))
    _, m_v = _call(compute_policy_loss_geo_mean, config, batch, rows, batch["log_prob"])
    _, m = _call(get_policy_loss_fn("gmpo"), config, batch, rows, batch["log_prob"])
    key = "actor/pg_clipfrac" if sign > 0 else "actor/pg_clipfrac_lower"
    assert m_v[key] == pytest.approx(1.0)
    assert m["actor/pg_clipfrac"] == 0.0 and m["actor/pg_clipfrac_lower"] == 0.0


def test_documented_difference_loss_agg_mode(actor_config) -> None:
    """geo_mean ignores loss_agg_mode (also token-sum); gmpo applies or refuses it."""
    if (reason := _versions.no_loss_agg_mode("token-sum")) is not None:
        pytest.skip(reason)
    batch = _batch()
    config = _config(actor_config, batch)
    config_sum = actor_config(loss_agg_mode="token-sum", info=dict(config.global_batch_info))
    rows = list(range(B))
    loss_a, _ = _call(compute_policy_loss_geo_mean, config, batch, rows, batch["log_prob"])
    loss_b, _ = _call(compute_policy_loss_geo_mean, config_sum, batch, rows, batch["log_prob"])
    assert loss_a.item() == loss_b.item()
    with pytest.raises(ValueError, match="token-sum"):
        _call(get_policy_loss_fn("gmpo"), config_sum, batch, rows, batch["log_prob"])


# ----------------------------------------------------------------------------------------------
# gmpo_core.gmpo_loss itself against geo_mean (formerly a module of its own in tests/): where both
# implement the same thing the values and gradients are equal; the documented differences
# (docs/differences.md) are asserted as differences.
# ----------------------------------------------------------------------------------------------


def _core_inputs(seed: int = 0, b: int = 6, t: int = 20) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g) * 2).requires_grad_()
    lengths = torch.tensor([t, t - 3, 5, 1, t, 7])[:b]
    return {
        "logp": logp,
        "old_logp": logp.detach() + 0.4 * torch.randn(b, t, generator=g),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 1.5])[:b],
        "mask": torch.arange(t)[None, :] < lengths[:, None],
    }


def _geo_mean(x: dict[str, torch.Tensor], eps: float = 0.4,
              weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:  # fmt: skip
    config = SimpleNamespace(clip_ratio=eps, clip_ratio_low=eps, clip_ratio_high=eps)
    adv = x["advantages"][:, None].expand_as(x["logp"])
    return compute_policy_loss_geo_mean(
        old_log_prob=x["old_logp"], log_prob=x["logp"], advantages=adv,
        response_mask=x["mask"].float(), loss_agg_mode="token-mean", config=config,
        rollout_is_weights=weights,
    )  # fmt: skip


@pytest.mark.parametrize("impl", ["plain", "compiled"])
def test_core_equal_loss_and_gradient_on_one_micro_batch(impl: str) -> None:
    x = _core_inputs()
    loss_v, metrics_v = _geo_mean(x)
    (grad_v,) = torch.autograd.grad(loss_v, x["logp"])
    out = gmpo_loss(**x, epsilon=0.4, impl=impl)
    (grad,) = torch.autograd.grad(out.loss, x["logp"])
    torch.testing.assert_close(out.loss, loss_v, rtol=1e-5, atol=1e-6)
    # verl divides by n + 1e-8 where we divide by n: a relative difference of ~1e-8 / n
    torch.testing.assert_close(grad, grad_v, rtol=1e-5, atol=1e-7)
    # drift metric: verl's ppo_kl is the mean of old_logp - logp over valid tokens
    r = (x["logp"] - x["old_logp"]).detach()[x["mask"]]
    assert metrics_v["actor/ppo_kl"] == pytest.approx(-r.mean().item(), rel=1e-5)
    # verl's clip fractions count every token outside [-eps, eps] by the sign of A; ours count
    # the tokens where the one-sided clip took effect (documented difference, below)
    a = x["advantages"][:, None].expand_as(x["mask"])[x["mask"]]
    outside = (r.abs() > 0.4).float()
    assert metrics_v["actor/pg_clipfrac_lower"] == pytest.approx(
        (outside * (a < 0)).mean().item(), rel=1e-6
    )
    assert out.metrics["clip_ratio/low_mean"].item() == pytest.approx(
        ((r < -0.4) & (a < 0)).float().mean().item(), rel=1e-6
    )


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_core_documented_difference_clipfrac_counts_unselected_tokens(sign: float) -> None:
    """verl counts A > 0 tokens with r < -eps (and A < 0 tokens with r > eps) as clipped although
    the one-sided clip never touches them; we count only tokens where the clip took effect."""
    x = _core_inputs()
    x["old_logp"] = x["logp"].detach() + sign  # r = -sign everywhere, outside [-0.4, 0.4]
    x["advantages"] = sign * (x["advantages"].abs() + 0.5)  # all A of the sign
    _, metrics_v = _geo_mean(x)
    out = gmpo_loss(**x, impl="plain")
    key = "actor/pg_clipfrac" if sign > 0 else "actor/pg_clipfrac_lower"
    assert metrics_v[key] == pytest.approx(1.0)
    assert out.metrics["clip_ratio/region_mean"].item() == 0.0


def test_core_documented_difference_zero_rollout_weight() -> None:
    """A zero token weight: verl folds log(1e-10) into the row weight; we drop the token."""
    x = _core_inputs()
    w = torch.ones_like(x["logp"])
    w[0, 0] = 0.0
    loss_v, _ = _geo_mean(x, weights=w)
    out = gmpo_loss(**x, is_weights=w, impl="plain")
    dropped = dict(x, mask=x["mask"].clone())
    dropped["mask"][0, 0] = False
    torch.testing.assert_close(out.loss, gmpo_loss(**dropped, impl="plain").loss)
    assert abs(loss_v.item() - out.loss.item()) > 1e-2


def test_core_documented_difference_nan_in_padding() -> None:
    x = _core_inputs()
    with torch.no_grad():
        x["logp"][~x["mask"]] = float("nan")
    loss_v, _ = _geo_mean(x)
    out = gmpo_loss(**x, impl="plain")
    assert torch.isnan(loss_v)
    assert torch.isfinite(out.loss)
