"""Unit tests of the verl policy loss: global normalization, metadata checks, modes, metrics.

verl's actor calls the loss once per micro-batch and backpropagates each result; FSDP averages
gradients over data-parallel ranks. These tests reproduce that arithmetic exactly: the gradient of
``sum over ranks and micro-batches of loss / dp_size`` must equal the one-batch gradient.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest

pytest.importorskip("verl")

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
from verl.utils.metric import AggregationType, Metric

import gmpo_verl
from gmpo_core import gmpo_loss
from tests.strategies import Batch, batches, weight_values
from tests.verl._loss_cases import (
    B,
    call_loss,
    loss_and_grad,
    split_rows,
    verl_batch,
    verl_info,
)
from tests.verl.conftest import actor_config_factory

pytestmark = pytest.mark.verl


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    gmpo_verl.register()


MODES = ["seq-mean-token-mean", "token-mean"]
SPLITS = [[8], [4, 4], [3, 5], [1, 2, 5], [2, 1, 1, 4], [1] * 8]


@pytest.mark.parametrize("loss_mode", ["gmpo", "gmpo_dual_clip"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sizes", SPLITS[1:], ids=str)
def test_invariant_to_micro_batch_split(actor_config, mode: str, sizes: list[int],
                                        loss_mode: str) -> None:  # fmt: skip
    batch = verl_batch()
    config = actor_config(loss_agg_mode=mode, info=verl_info(batch))
    whole, grad = loss_and_grad(config, batch, [[list(range(B))]], loss_mode)
    split, grad_split = loss_and_grad(config, batch, [split_rows(sizes)], loss_mode)
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad_split, grad, rtol=1e-6, atol=1e-8)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "ranks",
    [
        [[[0, 1, 2, 3]], [[4, 5, 6, 7]]],  # even ranks, one micro-batch each
        [[[0, 1], [2]], [[3, 4, 5], [6, 7]]],  # uneven ranks, uneven micro-batches
        [[[0]], [[1, 2, 3, 4, 5, 6, 7]]],
    ],
    ids=["even", "uneven", "one-row-rank"],
)
def test_invariant_to_data_parallel_size(actor_config, mode: str, ranks: list[Any]) -> None:
    """Each rank normalizes by the global batch and multiplies by dp_size; FSDP averages."""
    batch = verl_batch()
    one = actor_config(loss_agg_mode=mode, info=verl_info(batch, dp_size=1))
    two = actor_config(loss_agg_mode=mode, info=verl_info(batch, dp_size=2))
    whole, grad = loss_and_grad(one, batch, [[list(range(B))]])
    dp, grad_dp = loss_and_grad(two, batch, ranks)
    torch.testing.assert_close(dp, whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad_dp, grad, rtol=1e-6, atol=1e-8)


def test_seq_mean_token_mean_is_the_paper_mean(actor_config) -> None:
    """One micro-batch of the whole batch: the core's mean over rows (empty row included)."""
    batch = verl_batch()
    config = actor_config(info=verl_info(batch))
    leaf = batch["log_prob"].clone().requires_grad_()
    loss, _ = call_loss(config, slice(None), batch, leaf)
    adv = torch.nan_to_num(batch["advantages"][:, 0])
    ref = gmpo_loss(leaf, batch["old_log_prob"], adv, batch["response_mask"], epsilon=0.4,
                    is_weights=batch["rollout_is_weights"])  # fmt: skip
    torch.testing.assert_close(loss, ref.loss)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dp_size", [1, 4])
def test_equals_verl_agg_loss_of_the_broadcast_sequence_loss(actor_config, mode: str,
                                                             dp_size: int) -> None:  # fmt: skip
    """The normalization is verl's own agg_loss applied to L_i at every valid token of row i, so
    any engine that scales verl's built-in losses right (FSDP, Megatron) scales this one right."""
    batch = verl_batch()
    info = verl_info(batch, dp_size) | {"global_batch_size": 32, "batch_num_tokens": 300}
    config = actor_config(loss_agg_mode=mode, info=info)
    rows = [1, 2, 3, 5]  # a micro-batch with an empty row
    loss, _ = call_loss(config, rows, batch, batch["log_prob"])
    adv = torch.nan_to_num(batch["advantages"][rows, 0])
    per_seq = gmpo_loss(batch["log_prob"][rows], batch["old_log_prob"][rows], adv,
                        batch["response_mask"][rows], epsilon=0.4,
                        is_weights=batch["rollout_is_weights"][rows]).per_sequence_loss  # fmt: skip
    mask = batch["response_mask"][rows]
    expected = agg_loss(
        loss_mat=per_seq[:, None].expand(mask.shape), loss_mask=mask.float(), loss_agg_mode=mode,
        **info,
    )  # fmt: skip
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-7)


def test_token_mean_weights_rows_by_token_count(actor_config) -> None:
    # two rows, 1 and 3 tokens, r = 0: L = -A. token-mean = (1*(-1) + 3*(-2)) / 4 = -7/4
    mask = torch.tensor([[True, False, False], [True, True, True]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    logp = torch.zeros(2, 3)
    info = {"dp_size": 1, "global_batch_size": 2, "batch_num_tokens": 4}
    fn = get_policy_loss_fn("gmpo")
    kw = dict(old_log_prob=logp, log_prob=logp, advantages=adv, response_mask=mask)
    token, _ = fn(**kw, loss_agg_mode="token-mean",
                  config=actor_config(loss_agg_mode="token-mean", info=info))  # fmt: skip
    seq, _ = fn(**kw, loss_agg_mode="seq-mean-token-mean", config=actor_config(info=info))
    assert token.item() == pytest.approx(-7 / 4)
    assert seq.item() == pytest.approx(-3 / 2)  # (-1 - 2) / 2


def test_clip_ratio_is_a_log_space_bound(actor_config) -> None:
    """clip_ratio_low/high are log-space: r = 0.3 is inside exp(±0.4) (not clipped) and outside
    exp(±0.2); clip_ratio is used when clip_ratio_low/high are None."""
    mask = torch.ones(2, 4, dtype=torch.bool)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    old = torch.zeros(2, 4)
    logp = torch.tensor([[0.3] * 4, [-0.3] * 4], requires_grad=True)
    info = {"dp_size": 1, "global_batch_size": 2}
    for cfg, clipped in [
        (actor_config(info=info), False),
        (actor_config(info=info, clip_ratio_low=0.2, clip_ratio_high=0.2), True),
        (actor_config(info=info, clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None), True),
    ]:
        loss, metrics = get_policy_loss_fn("gmpo")(
            old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
            loss_agg_mode="seq-mean-token-mean", config=cfg,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, logp)
        assert (grad == 0).all().item() is clipped
        assert metrics["actor/pg_clipfrac"] == (0.5 if clipped else 0.0)
        assert metrics["actor/pg_clipfrac_lower"] == (0.5 if clipped else 0.0)


def test_metrics_hand_case(actor_config) -> None:
    # eps = 0.4, dual clip c = 3 (log 3 = 1.0986). Valid tokens (padding excluded):
    #   row 0, A = +1: r = [0.5, -0.6, 0.1]  -> high clip at 0.5 (1 token); -0.6 is not clipped
    #   row 1, A = -1: r = [-0.5, 1.2]       -> low clip at -0.5, dual clip at 1.2
    #   row 2, A =  0: r = [-0.9, 0.9]       -> nothing clipped
    # 7 valid tokens: pg_clipfrac = 1/7, lower = 1/7, dual = 1/7
    # ppo_kl = -mean(r) = -(0.5 - 0.6 + 0.1 - 0.5 + 1.2 - 0.9 + 0.9) / 7 = -0.7 / 7 = -0.1
    r = torch.tensor([[0.5, -0.6, 0.1], [-0.5, 1.2, 9.0], [-0.9, 0.9, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0, 0.0])[:, None].expand(3, 3)
    info = {"dp_size": 1, "global_batch_size": 3}
    _, m = get_policy_loss_fn("gmpo_dual_clip")(
        old_log_prob=torch.zeros(3, 3), log_prob=r, advantages=adv, response_mask=mask,
        loss_agg_mode="seq-mean-token-mean", config=actor_config(info=info),
    )  # fmt: skip
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 7)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 7)
    assert m["actor/pg_clipfrac_dual"] == pytest.approx(1 / 7)
    assert m["actor/ppo_kl"] == pytest.approx(-0.1, abs=1e-6)
    assert m["actor/log_ratio_min"] == pytest.approx(-0.9)
    assert m["actor/log_ratio_max"] == pytest.approx(1.2)
    assert all(isinstance(v, float) for v in m.values())
    # verl's ppo_loss wraps them as Metric(MEAN) and averages them over micro-batches and ranks
    wrapped = Metric.from_dict(m, aggregation=AggregationType.MEAN)
    assert wrapped["actor/ppo_kl"].aggregate() == pytest.approx(-0.1, abs=1e-6)


def test_plain_gmpo_ignores_clip_ratio_c(actor_config) -> None:
    """clip_ratio_c defaults to 3.0 in verl: it must not switch the dual clip on for plain gmpo."""
    r = torch.tensor([[2.0, 2.0]], requires_grad=True)  # ratio e^2 > 3, A < 0
    kw = dict(old_log_prob=torch.zeros(1, 2), log_prob=r, advantages=-torch.ones(1, 2),
              response_mask=torch.ones(1, 2), loss_agg_mode="seq-mean-token-mean",
              config=actor_config(info={"dp_size": 1, "global_batch_size": 1}))  # fmt: skip
    plain, m_plain = get_policy_loss_fn("gmpo")(**kw)
    dual, m_dual = get_policy_loss_fn("gmpo_dual_clip")(**kw)
    assert plain.item() == pytest.approx(torch.e**2)  # -A * exp(mean r)
    assert dual.item() == pytest.approx(3.0)  # capped at clip_ratio_c
    assert "actor/pg_clipfrac_dual" not in m_plain and m_dual["actor/pg_clipfrac_dual"] == 1.0


@pytest.mark.parametrize(
    ("value", "match"),
    [(1.0, r"clip_ratio_c must be a finite number > 1 .*got 1.0"), (None, "clip_ratio_c")],
)
def test_dual_clip_needs_clip_ratio_c_above_one(actor_config, value: Any, match: str) -> None:
    batch = verl_batch()
    config = actor_config(info=verl_info(batch), clip_ratio_c=value)
    with pytest.raises(ValueError, match=match):
        call_loss(config, slice(None), batch, batch["log_prob"], "gmpo_dual_clip")


def test_advantages_varying_within_a_row_use_the_mean_and_warn(
    actor_config, caplog: pytest.LogCaptureFixture
) -> None:
    from gmpo_verl import loss as loss_module

    loss_module._notified.discard("advantage-spread")
    batch = verl_batch(weights=False)
    config = actor_config(info=verl_info(batch))
    varying = dict(batch, advantages=batch["advantages"].clone())
    varying["advantages"][0, :6] += 0.5
    varying["advantages"][0, 6:] -= 0.5  # row 0 (12 tokens): the same mean
    with caplog.at_level(logging.WARNING, logger="gmpo_verl"):
        loss_const, _ = call_loss(config, slice(None), batch, batch["log_prob"])
        assert not caplog.records
        loss_vary, _ = call_loss(config, slice(None), varying, batch["log_prob"])
    torch.testing.assert_close(loss_vary, loss_const)
    assert len(caplog.records) == 1 and "vary within a sequence" in caplog.records[0].message


def test_nan_in_padding_changes_nothing(actor_config) -> None:
    batch = verl_batch()
    clean = {k: torch.nan_to_num(v, nan=0.0) for k, v in batch.items()}
    config = actor_config(info=verl_info(batch))
    loss_nan, m_nan = call_loss(config, slice(None), batch, batch["log_prob"])
    loss_clean, m_clean = call_loss(config, slice(None), clean, clean["log_prob"])
    torch.testing.assert_close(loss_nan, loss_clean)
    assert m_nan == pytest.approx(m_clean)


def test_bf16_log_probs(actor_config) -> None:
    batch = verl_batch()
    config = actor_config(info=verl_info(batch))
    leaf = batch["log_prob"].to(torch.bfloat16).requires_grad_()
    loss, _ = call_loss(config, slice(None), batch, leaf)
    (grad,) = torch.autograd.grad(loss, leaf)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16


@settings(max_examples=25)
@given(
    batch=batches(max_b=7, beta=False, weights=False, dual=False),
    data=st.data(),
    mode=st.sampled_from(MODES),
)
def test_property_invariant_to_any_split(batch: Batch, data: st.DataObject, mode: str) -> None:
    """Any split into data-parallel ranks and micro-batches (empty rows, holes in rows and
    (B, T) rollout weights with zeros included) gives the one-batch loss and gradient."""
    b, t = batch.shape
    dp = data.draw(st.integers(1, min(3, b)), label="dp_size")
    cuts = sorted(data.draw(st.lists(st.integers(1, max(b - 1, 1)), max_size=b - 1, unique=True)))
    bounds = [0, *cuts, b]
    micro = [list(range(lo, hi)) for lo, hi in itertools.pairwise(bounds)]
    # deal the micro-batches to ranks round-robin: uneven ranks, uneven micro-batches
    ranks = [micro[k::dp] for k in range(dp)]
    weights = data.draw(arrays(np.float32, (b, t), elements=weight_values), label="weights")
    tensors = {
        "log_prob": torch.from_numpy(batch.logp),
        "old_log_prob": torch.from_numpy(batch.old_logp),
        "advantages": torch.from_numpy(batch.advantages)[:, None].expand(b, t).clone(),
        "response_mask": torch.from_numpy(batch.mask),
        "rollout_is_weights": torch.from_numpy(weights),
    }
    eps = batch.kwargs["epsilon"]
    fields = dict(clip_ratio_low=eps, clip_ratio_high=batch.kwargs.get("epsilon_high", eps))
    make = actor_config_factory()
    one = make(loss_agg_mode=mode, info=verl_info(tensors, 1), **fields)
    many = make(loss_agg_mode=mode, info=verl_info(tensors, len(ranks)), **fields)
    whole, grad = loss_and_grad(one, tensors, [[list(range(b))]])
    split, grad_split = loss_and_grad(many, tensors, ranks)
    scale = max(1.0, whole.abs().item(), grad.abs().max().item())
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(grad_split, grad, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize(
    ("value", "impl"), [(None, "plain"), ("", "plain"), ("compiled", "compiled")]
)
def test_impl_from_the_environment(monkeypatch, value: str | None, impl: str) -> None:
    """GMPO_VERL_IMPL chooses gmpo_core's path by its names (gmpo_core.options); empty is unset."""
    from gmpo_verl import loss

    if value is None:
        monkeypatch.delenv(loss.IMPL_ENV, raising=False)
    else:
        monkeypatch.setenv(loss.IMPL_ENV, value)
    assert loss._impl() == impl
    monkeypatch.setenv(loss.IMPL_ENV, "fast")
    with pytest.raises(ValueError, match=r"GMPO_VERL_IMPL must be 'plain' \(the default\) or"):
        loss._impl()
