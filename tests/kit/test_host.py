"""``gmpo_kit``'s host record and its loss with the KL over the host's mask: the core's rules
under a host's names, advantages reduced to (B,) by each host's policy, and the KL that reads
more tokens than the policy term (0 at B = 0, as the core's loss)."""

from __future__ import annotations

import pytest
import torch

from gmpo_core import gmpo_loss, sequence_kl
from gmpo_kit import (
    SCALE,
    SPREAD,
    HostOptions,
    MetricStates,
    gmpo_loss_with_kl,
    read,
    row_mean,
    spread_values,
    varies_within_rows,
)

PER_SEQUENCE = HostOptions(host="Trainer", dual_clip="delta")
PER_TOKEN = HostOptions(
    host="verl", epsilon="clip_ratio_low", epsilon_high="clip_ratio_high",
    dual_clip="clip_ratio_c", mask="response_mask", token_advantages=True,
)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0.0, None, None), r"^clip_ratio_low must be a finite number > 0"),
        ((0.2, float("inf"), None), r"^clip_ratio_high must be a finite number > 0"),
        ((0.2, 0.3, 1.0), r"^clip_ratio_c must be a finite number > 1"),
    ],
)
def test_the_core_rules_name_the_host_fields(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        PER_TOKEN.check(*args)


def test_the_check_returns_the_core_values() -> None:
    assert PER_SEQUENCE.check(0.2, None, None) == (0.2, 0.2, None)
    low, high, log_dual = PER_SEQUENCE.check(0.2, 0.3, 2.0)
    assert (low, high) == (0.2, 0.3) and log_dual == pytest.approx(0.6931471805599453, rel=1e-15)


def test_the_impl_rule_names_the_host_option() -> None:
    host = HostOptions(host="h", impl="GMPO_H_IMPL")
    assert host.check_impl(None) == "plain" and host.check_impl("compiled") == "compiled"
    with pytest.raises(ValueError, match=r"^GMPO_H_IMPL must be 'plain' \(the default\)"):
        host.check_impl("eager")


def test_one_advantage_per_sequence() -> None:
    valid = torch.ones(3, 4, dtype=torch.bool)
    a = torch.tensor([1.0, -2.0, 0.5])
    assert PER_SEQUENCE.advantages(a, valid) is a
    assert torch.equal(PER_SEQUENCE.advantages(a[:, None], valid), a)
    for bad in (torch.zeros(3, 4), torch.zeros(())):
        with pytest.raises(ValueError) as err:
            PER_SEQUENCE.advantages(bad, valid)
        want = f"Trainer needs one advantage per sequence, shape (B,); got {tuple(bad.shape)}"
        assert str(err.value) == want


def test_advantages_per_token_are_their_row_mean() -> None:
    valid = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    a = torch.tensor([[1.0, 3.0, 99.0], [5.0, 5.0, 5.0], [-1.0, -1.0, -1.0]])
    assert PER_TOKEN.advantages(a, valid).tolist() == [2.0, 0.0, -1.0]  # empty row: 0
    row = torch.tensor([1.0, 2.0, 3.0])
    assert PER_TOKEN.advantages(row, valid) is row
    with pytest.raises(ValueError) as err:
        PER_TOKEN.advantages(a[:, :2], valid)
    assert str(err.value) == (
        "advantages must have the shape of response_mask (3, 3) (or be (B,)), got (3, 2)"
    )


@pytest.mark.parametrize(
    ("advantages", "varies"),
    [
        (torch.tensor([[2.0, 2.0, 7.0], [-1.0, -1.0, -1.0]]), False),  # 7.0: a masked token
        (torch.tensor([[2.0, 2.5, 2.0], [-1.0, -1.0, -1.0]]), True),
        (torch.tensor([2.0, -1.0]), False),  # (B,): nothing to vary
    ],
)
def test_the_spread_of_advantages_within_rows(advantages, varies) -> None:
    valid = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    states = MetricStates()
    PER_TOKEN.advantages(advantages, valid, states=states)
    host = read(spread_values(states.reduce()))
    assert set(host) == {SPREAD, SCALE}
    assert varies_within_rows(host) is varies
    if varies:
        assert host[SPREAD] == 0.25 and host[SCALE] == 2.5


def test_spread_tolerance_is_relative_to_the_scale() -> None:
    assert not varies_within_rows({SPREAD: 1e-3, SCALE: 1e3})
    assert varies_within_rows({SPREAD: 1e-3, SCALE: 1.0})
    assert varies_within_rows({SPREAD: float("nan"), SCALE: 1.0})


def _batch(rows: int = 5, tokens: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(rows, tokens, generator=g, dtype=torch.float64)
    return {
        "logp": logp.requires_grad_(),
        "old_logp": logp.detach() + 0.3 * torch.randn(rows, tokens, generator=g, dtype=logp.dtype),
        "advantages": torch.randn(rows, generator=g, dtype=logp.dtype),
        "mask": torch.rand(rows, tokens, generator=g) > 0.2,
        "ref_logp": logp.detach() + 0.2 * torch.randn(rows, tokens, generator=g, dtype=logp.dtype),
    }


def test_without_a_host_mask_it_is_the_core_loss() -> None:
    b = _batch()
    got = gmpo_loss_with_kl(**b, beta=0.1)
    want = gmpo_loss(**b, beta=0.1)
    assert torch.equal(got.loss, want.loss) and torch.equal(got.kl_sum, want.kl_sum)
    assert torch.equal(got.kl_tokens, want.stats.num_tokens)


def test_the_kl_over_the_host_mask() -> None:
    b = _batch()
    policy = b["mask"].clone()
    policy[1] = False  # a row the policy term leaves out (an off-policy row), the KL keeps
    policy[:, -2:] = False  # and tokens (low entropy)
    got = gmpo_loss_with_kl(**{**b, "mask": policy}, kl_mask=b["mask"], beta=0.1)
    core = gmpo_loss(**{**b, "mask": policy}, beta=0.0)
    kl = sequence_kl(b["logp"], b["ref_logp"], b["mask"])
    torch.testing.assert_close(got.loss, (core.per_sequence_loss + 0.1 * kl).mean())
    n = b["mask"].sum(-1)
    torch.testing.assert_close(got.kl_sum, (kl.detach() * n).sum())
    assert got.kl_tokens.item() == n.sum().item()
    assert got.out.stats.num_tokens.item() == policy.sum().item()  # the policy term's
    inside = gmpo_loss(**{**b, "mask": policy}, beta=0.1)  # the KL over the policy mask
    assert not torch.allclose(got.loss, inside.loss)


def test_zero_token_weights_leave_the_kl() -> None:
    b = _batch()
    w = torch.ones(b["mask"].shape, dtype=b["logp"].dtype)
    w[0, :3] = 0
    got = gmpo_loss_with_kl(**b, kl_mask=b["mask"], beta=0.1, is_weights=w)
    kept = b["mask"] & (w != 0)
    torch.testing.assert_close(got.kl_tokens, kept.sum())
    # the KL over the same tokens as the core's: the core's own loss
    torch.testing.assert_close(got.loss, gmpo_loss(**b, beta=0.1, is_weights=w).loss)


@pytest.mark.parametrize("apart", [False, True])
def test_an_empty_batch_gives_zero(apart) -> None:
    b = {k: v[:0] for k, v in _batch().items()}
    logp = b["logp"].detach().requires_grad_()
    got = gmpo_loss_with_kl(**{**b, "logp": logp}, kl_mask=b["mask"] if apart else None, beta=0.1)
    assert got.loss.item() == 0.0
    got.loss.backward()
    assert logp.grad is not None and logp.grad.shape == (0, 6)


def test_row_mean() -> None:
    assert row_mean(torch.tensor([1.0, 2.0, 6.0])).item() == 3.0
    empty = torch.zeros(0, requires_grad=True)
    assert row_mean(empty).item() == 0.0
