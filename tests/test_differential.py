"""Differential tests against verl's real geo_mean loss (skipped unless verl is installed).

Where both implement the same thing the values and gradients are equal; the documented
differences (docs/differences.md) are asserted as differences.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gmpo_core import gmpo_loss

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def geo_mean():  # type: ignore[no-untyped-def]
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    return core_algos.compute_policy_loss_geo_mean


def _inputs(seed: int = 0, b: int = 6, t: int = 20) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g) * 2).requires_grad_()
    lengths = torch.tensor([t, t - 3, 5, 1, t, 7])[:b]
    return {
        "logp": logp,
        "old_logp": logp.detach() + 0.4 * torch.randn(b, t, generator=g),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 1.5])[:b],
        "mask": torch.arange(t)[None, :] < lengths[:, None],
    }


def _verl(geo_mean, x, eps=0.4, weights=None):  # type: ignore[no-untyped-def]
    config = SimpleNamespace(clip_ratio=eps, clip_ratio_low=eps, clip_ratio_high=eps)
    adv = x["advantages"][:, None].expand_as(x["logp"])
    return geo_mean(
        old_log_prob=x["old_logp"], log_prob=x["logp"], advantages=adv,
        response_mask=x["mask"].float(), loss_agg_mode="token-mean", config=config,
        rollout_is_weights=weights,
    )  # fmt: skip


@pytest.mark.parametrize("impl", ["plain", "compiled"])
def test_equal_loss_and_gradient_on_one_micro_batch(geo_mean, impl: str) -> None:  # type: ignore[no-untyped-def]
    x = _inputs()
    loss_v, metrics_v = _verl(geo_mean, x)
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
def test_documented_difference_clipfrac_counts_unselected_tokens(geo_mean, sign: float) -> None:  # type: ignore[no-untyped-def]
    """verl counts A > 0 tokens with r < -eps (and A < 0 tokens with r > eps) as clipped although
    the one-sided clip never touches them; we count only tokens where the clip took effect."""
    x = _inputs()
    x["old_logp"] = x["logp"].detach() + sign  # r = -sign everywhere, outside [-0.4, 0.4]
    x["advantages"] = sign * (x["advantages"].abs() + 0.5)  # all A of the sign
    _, metrics_v = _verl(geo_mean, x)
    out = gmpo_loss(**x, impl="plain")
    key = "actor/pg_clipfrac" if sign > 0 else "actor/pg_clipfrac_lower"
    assert metrics_v[key] == pytest.approx(1.0)
    assert out.metrics["clip_ratio/region_mean"].item() == 0.0


def test_documented_difference_zero_rollout_weight(geo_mean) -> None:  # type: ignore[no-untyped-def]
    """A zero token weight: verl folds log(1e-10) into the row weight; we drop the token."""
    x = _inputs()
    w = torch.ones_like(x["logp"])
    w[0, 0] = 0.0
    loss_v, _ = _verl(geo_mean, x, weights=w)
    out = gmpo_loss(**x, is_weights=w, impl="plain")
    dropped = dict(x, mask=x["mask"].clone())
    dropped["mask"][0, 0] = False
    torch.testing.assert_close(out.loss, gmpo_loss(**dropped, impl="plain").loss)
    assert abs(loss_v.item() - out.loss.item()) > 1e-2


def test_documented_difference_nan_in_padding(geo_mean) -> None:  # type: ignore[no-untyped-def]
    x = _inputs()
    with torch.no_grad():
        x["logp"][~x["mask"]] = float("nan")
    loss_v, _ = _verl(geo_mean, x)
    out = gmpo_loss(**x, impl="plain")
    assert torch.isnan(loss_v)
    assert torch.isfinite(out.loss)
