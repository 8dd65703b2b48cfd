"""The verl policy loss's configuration: the batch metadata it needs, the aggregation modes it refuses, its one notice, and the clip keys' types (each error names the key)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("verl")

import torch

import gmpo_verl
from tests.verl import _versions
from tests.verl._loss_cases import (
    call_loss,
    verl_batch,
    verl_info,
)

pytestmark = pytest.mark.verl


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    gmpo_verl.register()


@pytest.mark.parametrize(
    ("info", "match"),
    [
        (None, "global_batch_info"),
        ({"dp_size": 1}, "global_batch_size"),
        ({"dp_size": 0, "global_batch_size": 8}, "dp_size"),
        ({"dp_size": True, "global_batch_size": 8}, "dp_size"),
        ({"dp_size": 1, "global_batch_size": None}, "global_batch_size"),
        ({"dp_size": 1, "global_batch_size": 2.5}, "global_batch_size"),
        ({"dp_size": 1, "global_batch_size": 4}, "smaller than this micro-batch"),
        ({"global_batch_size": 8, "batch_num_tokens": 10}, "dp_size"),
    ],
)
def test_missing_or_invalid_metadata_is_refused(actor_config, info: Any, match: str) -> None:
    batch = verl_batch()
    config = actor_config(info=info)
    with pytest.raises(ValueError, match=match):
        call_loss(config, slice(None), batch, batch["log_prob"])


def test_token_mean_needs_batch_num_tokens(actor_config) -> None:
    batch = verl_batch()
    config = actor_config(loss_agg_mode="token-mean", info={"dp_size": 1, "global_batch_size": 8})
    with pytest.raises(ValueError, match="batch_num_tokens"):
        call_loss(config, slice(None), batch, batch["log_prob"])


def test_metadata_as_integer_tensor_is_accepted(actor_config) -> None:
    batch = verl_batch()
    info = verl_info(batch) | {"global_batch_size": torch.tensor(8)}
    loss, _ = call_loss(actor_config(info=info), slice(None), batch, batch["log_prob"])
    assert torch.isfinite(loss)


@pytest.mark.parametrize("mode", ["token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_sum_modes_are_refused_naming_the_mode_to_use(actor_config, mode: str) -> None:
    if (reason := _versions.no_loss_agg_mode(mode)) is not None:
        pytest.skip(reason)
    batch = verl_batch()
    config = actor_config(loss_agg_mode=mode, info=verl_info(batch))
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        call_loss(config, slice(None), batch, batch["log_prob"])


def test_an_unknown_mode_is_named_as_unknown(actor_config) -> None:
    """(CHANGELOG, 0.2): an unknown loss_agg_mode was refused as if it were "a token sum"."""
    from gmpo_verl.loss import check_loss_agg_mode

    with pytest.raises(ValueError, match="seq-mean-token-sum") as info:
        check_loss_agg_mode("seq-mean")
    assert "is not one of verl's modes" in str(info.value)
    assert "token sum" not in str(info.value)
    with pytest.raises(ValueError, match="a token sum would rescale"):
        check_loss_agg_mode("token-sum")


def test_token_mean_notice_once(actor_config, caplog: pytest.LogCaptureFixture) -> None:
    from gmpo_verl import loss as loss_module

    loss_module._notified.discard("token-mean")
    batch = verl_batch()
    config = actor_config(loss_agg_mode="token-mean", info=verl_info(batch))
    with caplog.at_level(logging.WARNING, logger="gmpo_verl"):
        call_loss(config, slice(None), batch, batch["log_prob"])
        call_loss(config, slice(None), batch, batch["log_prob"])
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "seq-mean-token-mean" in caplog.records[0].message


# Regression, defect 11 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): gmpo_verl, token-mean: a batch_num_tokens below the micro-batch's own token count
# is refused.
def test_verl_token_mean_refuses_too_few_global_tokens() -> None:
    from types import SimpleNamespace

    b, t = 9, 11  # 99 response tokens
    cfg = SimpleNamespace(
        clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4, clip_ratio_c=3.0,
        global_batch_info={"dp_size": 1, "global_batch_size": b, "batch_num_tokens": 1},
    )  # fmt: skip
    logp = torch.zeros(b, t, requires_grad=True)
    args = {
        "old_log_prob": torch.zeros(b, t), "log_prob": logp, "advantages": torch.ones(b, t),
        "response_mask": torch.ones(b, t), "loss_agg_mode": "token-mean", "config": cfg,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"batch_num_tokens.*1.*99"):
        gmpo_verl.compute_policy_loss_gmpo(**args)
    cfg.global_batch_info["batch_num_tokens"] = 99
    loss, _ = gmpo_verl.compute_policy_loss_gmpo(**args)
    assert torch.isfinite(loss)


# Regression (CHANGELOG, 0.2): clip_ratio_low=True (read as 1.0) and "0.3" went through
# float() while clip_ratio_c=True was refused, and "abc" failed without naming the key. Now every
# clip key takes a number only (verl's configs come from Hydra/OmegaConf, which types them), and
# each error names the key it read, clip_ratio included when it stands in for a null bound.
@pytest.mark.parametrize("value", [True, "0.3", "3.0", "abc"], ids=repr)
@pytest.mark.parametrize(
    ("key", "fields"),
    [
        ("clip_ratio_low", {}),
        ("clip_ratio_high", {}),
        ("clip_ratio_c", {}),
        ("clip_ratio", {"clip_ratio_low": None, "clip_ratio_high": None}),
    ],
)
def test_clip_keys_take_numbers_only_and_errors_name_the_key(
    actor_config, key: str, fields: dict[str, Any], value: Any
) -> None:
    batch = verl_batch()
    config = actor_config(info=verl_info(batch), **fields, **{key: value})
    with pytest.raises(ValueError, match=rf"^{key} must be a finite number .*got {value!r}"):
        call_loss(config, slice(None), batch, batch["log_prob"], "gmpo_dual_clip")


# Regression (CHANGELOG, 0.2): batch_num_tokens=0 was reported as "= 1" (the denominator it
# had been raised to), not as the value given.
def test_too_few_global_tokens_reports_the_value_given(actor_config) -> None:
    batch = verl_batch()
    info = verl_info(batch) | {"batch_num_tokens": 0}
    config = actor_config(loss_agg_mode="token-mean", info=info)
    with pytest.raises(ValueError, match=r"\['batch_num_tokens'\] = 0 is smaller .* own 49 "):
        call_loss(config, slice(None), batch, batch["log_prob"])
    # a global mini-batch without a valid token is consistent with a micro-batch without one
    empty = {k: v[[2]] for k, v in batch.items()}  # row 2 is fully masked
    loss, _ = call_loss(config, [0], empty, empty["log_prob"])
    assert loss.item() == 0.0
