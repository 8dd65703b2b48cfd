"""Small cases worked by hand, the arithmetic in the comments (docs/semantics.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gmpo_core import (
    clip_log_ratio,
    clip_metrics,
    gmpo_loss,
    masked_geometric_mean,
    masked_power_mean,
    reference,
    sequence_kl,
    trust_region_log_ratio,
)

pytestmark = pytest.mark.parametrize("impl", ["plain", "compiled"])


def _grad(out_loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(out_loss, logp)
    return g


def test_two_rows(impl: str) -> None:
    # Row 0: A = +1, r = [0.1, 0.6, -0.2], eps = 0.4
    #   c = [min(0.1, .4), min(0.6, .4), min(-0.2, .4)] = [0.1, 0.4, -0.2]; log_coef = 0.3 / 3 = 0.1
    #   loss_0 = -1 * exp(0.1) = -1.1051709
    # Row 1: A = -2, r = [-0.5, 0.3, (padding)]
    #   c = [max(-0.5, -.4), max(0.3, -.4)] = [-0.4, 0.3]; log_coef = -0.1 / 2 = -0.05
    #   loss_1 = 2 * exp(-0.05) = 1.9024588
    # loss = (loss_0 + loss_1) / 2 = 0.3986440
    logp = torch.tensor([[0.1, 0.6, -0.2], [-0.5, 0.3, 99.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = gmpo_loss(
        logp, torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask, epsilon=0.4, impl=impl
    )
    torch.testing.assert_close(out.log_coef, torch.tensor([0.1, -0.05]))
    torch.testing.assert_close(
        out.per_sequence_loss, torch.tensor([-math.exp(0.1), 2 * math.exp(-0.05)])
    )
    torch.testing.assert_close(out.loss, torch.tensor((2 * math.exp(-0.05) - math.exp(0.1)) / 2))
    # d loss / d logp_t = (1/B) * (-A) * exp(log_coef) / n for unclipped tokens, else 0:
    #   row 0: -exp(0.1) / 3 / 2 = -0.1841952 at t = 0, 2; t = 1 clipped (0.6 > 0.4)
    #   row 1: t = 0 clipped (-0.5 < -0.4); t = 1: 2 * exp(-0.05) / 2 / 2 = 0.4756147
    g = _grad(out.loss, logp)
    a, b = -math.exp(0.1) / 6, math.exp(-0.05) / 2
    torch.testing.assert_close(g, torch.tensor([[a, 0.0, a], [0.0, b, 0.0]]))
    # metrics: 5 valid tokens, 1 clipped high (row 0), 1 clipped low (row 1)
    m = out.metrics
    assert (m["clip_ratio/high_mean"].item(), m["clip_ratio/low_mean"].item()) == pytest.approx(
        (0.2, 0.2)
    )
    assert m["clip_ratio/region_mean"].item() == pytest.approx(0.4)
    assert m["clip_ratio/high_max"].item() == pytest.approx(1 / 3)  # row 0: 1 of 3
    assert m["clip_ratio/low_min"].item() == pytest.approx(0.0)  # row 0 has no low clip
    assert (m["log_ratio/min"].item(), m["log_ratio/max"].item()) == pytest.approx((-0.5, 0.6))
    assert out.stats.num_tokens.item() == 5


@pytest.mark.parametrize("traced", [False, True], ids=["called", "in a user's compile"])
def test_tokens_on_the_bound_are_not_clipped(impl: str, traced: bool) -> None:
    # eps = 0.5 is exact in binary. A = +1, r = 0.5 = eps_h: unclipped, gradient -exp(0.5)/2/2;
    # r = 0.5 + 2^-10 > eps_h: clipped, gradient 0. A = -1, r = -0.5 = -eps_l: unclipped.
    logp = torch.tensor([[0.5, 0.5 + 2**-10], [-0.5, -0.5 - 2**-10]], requires_grad=True)
    fn = torch.compile(gmpo_loss, backend="eager", fullgraph=True) if traced else gmpo_loss
    out = fn(
        logp, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), epsilon=0.5, impl=impl
    )
    g = _grad(out.loss, logp)
    # row 0: c = [0.5, 0.5], log_coef 0.5; row 1: c = [-0.5, -0.5], log_coef -0.5
    torch.testing.assert_close(
        g, torch.tensor([[-math.exp(0.5) / 4, 0.0], [math.exp(-0.5) / 4, 0.0]])
    )
    assert out.metrics["clip_ratio/high_mean"].item() == 0.25  # only the token strictly above
    assert out.metrics["clip_ratio/low_mean"].item() == 0.25


def test_empty_and_zero_advantage_rows_count_in_the_mean(impl: str) -> None:
    # Rows: [A=1, r=0.2], [A=3, empty], [A=0, r=5]. Only row 0 contributes: -exp(0.2); loss /3.
    logp = torch.tensor([[0.2], [7.0], [5.0]], requires_grad=True)
    mask = torch.tensor([[1], [0], [1]])
    out = gmpo_loss(logp, torch.zeros(3, 1), torch.tensor([1.0, 3.0, 0.0]), mask, impl=impl)
    torch.testing.assert_close(out.per_sequence_loss, torch.tensor([-math.exp(0.2), 0.0, 0.0]))
    torch.testing.assert_close(out.loss, torch.tensor(-math.exp(0.2) / 3))
    # the A = 0 row follows the A >= 0 convention: log_coef = min(5, 0.4) = 0.4; empty row: 0
    torch.testing.assert_close(out.log_coef, torch.tensor([0.2, 0.0, 0.4]))
    g = _grad(out.loss, logp)
    torch.testing.assert_close(g, torch.tensor([[-math.exp(0.2) / 3], [0.0], [0.0]]))


def test_dual_clip_caps_negative_advantage_ratios(impl: str) -> None:
    # A = -1, r = [2.0, 0.5], dual_clip = e (log c = 1): c = [min(max(2, -.4), 1), 0.5] = [1, .5]
    # log_coef = 0.75; loss = exp(0.75); the capped token gets no gradient.
    logp = torch.tensor([[2.0, 0.5]], requires_grad=True)
    out = gmpo_loss(
        logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=math.e, impl=impl
    )
    torch.testing.assert_close(out.loss, torch.tensor(math.exp(0.75)))
    torch.testing.assert_close(_grad(out.loss, logp), torch.tensor([[0.0, math.exp(0.75) / 2]]))
    assert out.metrics["clip_ratio/dual_mean"].item() == 0.5
    # without the dual clip: log_coef = 1.25
    out = gmpo_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), impl=impl)
    torch.testing.assert_close(out.loss, torch.tensor(math.exp(1.25)))
    assert "clip_ratio/dual_mean" not in out.metrics


def test_rollout_weights(impl: str) -> None:
    # (B, T) weights [2, 8, 0]: the zero-weight token is dropped; geometric mean sqrt(2*8) = 4.
    # r = [0.1, 0.3, 9.0] with the third token dropped: log_coef = 0.2; loss = -A * exp(0.2) * 4
    logp = torch.tensor([[0.1, 0.3, 9.0]], requires_grad=True)
    args = (logp, torch.zeros(1, 3), torch.tensor([0.5]), torch.ones(1, 3))
    out = gmpo_loss(*args, is_weights=torch.tensor([[2.0, 8.0, 0.0]]), impl=impl)
    torch.testing.assert_close(out.loss, torch.tensor(-0.5 * math.exp(0.2) * 4))
    assert out.stats.num_tokens.item() == 2  # the dropped token is gone from the metrics too
    # per-token gradient: -A * exp(0.2) * 4 / 2 for the two kept tokens, 0 for the dropped one
    torch.testing.assert_close(
        _grad(out.loss, logp), torch.tensor([[-math.exp(0.2), -math.exp(0.2), 0.0]])
    )
    # (B,) weight 3 on the same row with all three tokens: log_coef = min(9, .4) -> (0.1+0.3+0.4)/3
    out = gmpo_loss(*args, is_weights=torch.tensor([3.0]), impl=impl)
    torch.testing.assert_close(out.loss, torch.tensor(-0.5 * math.exp(0.8 / 3) * 3))


def test_sequence_kl(impl: str) -> None:
    # A = 0 so only beta * KL remains. Tokens: d = ref - logp = [ln 2, 0]:
    # k3 = [2 - 1 - ln 2, 0] = [0.3068528, 0]; KL = 0.3068528 / 2; beta = 0.5 -> 0.0767132
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[math.log(2), -1.0]])
    out = gmpo_loss(logp, None, torch.zeros(1), torch.ones(1, 2), beta=0.5, ref_logp=ref, impl=impl)
    k = 1 - math.log(2)
    torch.testing.assert_close(out.loss, torch.tensor(0.5 * k / 2))
    assert out.metrics["kl"].item() == pytest.approx(k / 2)
    # d/dlogp k3 = 1 - exp(d) = [1 - 2, 0]; times beta / n = 0.25
    torch.testing.assert_close(_grad(out.loss, logp), torch.tensor([[-0.25, 0.0]]))


def test_building_blocks_by_hand(impl: str) -> None:
    del impl  # the blocks have one implementation
    r = torch.tensor([[0.5, -0.9, 0.1], [0.5, -0.9, 0.1]])
    a = torch.tensor([1.0, -1.0])
    torch.testing.assert_close(clip_log_ratio(r, epsilon=0.4), torch.tensor([[0.4, -0.4, 0.1]] * 2))
    torch.testing.assert_close(
        clip_log_ratio(r, epsilon=1.0, epsilon_high=0.2), torch.tensor([[0.2, -0.9, 0.1]] * 2)
    )
    # A > 0 keeps the lower side open, A < 0 the upper side
    torch.testing.assert_close(
        trust_region_log_ratio(r, a), torch.tensor([[0.4, -0.9, 0.1], [0.5, -0.4, 0.1]])
    )
    # per-sequence log-ratios work too
    torch.testing.assert_close(
        trust_region_log_ratio(torch.tensor([0.9, -0.9]), a), torch.tensor([0.4, -0.4])
    )
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    torch.testing.assert_close(
        masked_geometric_mean(r, mask), torch.tensor([-0.2, 0.0])
    )  # (0.5-0.9)/2
    torch.testing.assert_close(sequence_kl(torch.zeros(1, 2), torch.tensor([[math.log(2), 0.0]]), torch.ones(1, 2)),
                               torch.tensor([(1 - math.log(2)) / 2]))  # fmt: skip
    s = clip_metrics(r, a, torch.ones(2, 3))
    # row 0 (A>0): 0.5 > 0.4 high; row 1 (A<0): -0.9 < -0.4 low
    assert (s.num_tokens.item(), s.num_clipped_high.item(), s.num_clipped_low.item()) == (6, 1, 1)


def test_power_mean_by_hand(impl: str) -> None:
    del impl  # the blocks have one implementation
    # Row 0: ratios exp(x) = [1, 3] (x = [0, ln 3]), a NaN at the masked third position. Row 1:
    # empty. log M_p = (1/p) log((1^p + 3^p) / 2):
    #   p = -2: ((1 + 1/9) / 2)^(-1/2) = (5/9)^(-1/2) = 3 / sqrt(5)  -> ln 3 - ln 5 / 2 = 0.2938933
    #   p = -1: 2 / (1 + 1/3) = 3/2 (the harmonic mean)               -> ln 1.5          = 0.4054651
    #   p =  0: sqrt(1 * 3) (the geometric mean)                       -> ln 3 / 2        = 0.5493061
    #   p =  1: (1 + 3) / 2 = 2 (the arithmetic mean)                  -> ln 2            = 0.6931472
    #   p =  2: sqrt((1 + 9) / 2) = sqrt(5)                            -> ln 5 / 2        = 0.8047190
    # d log M_p / d x_t = 3^(p t) / (1 + 3^p) (t = 0, 1): p = -2: [9/10, 1/10]; -1: [3/4, 1/4];
    # 0: [1/2, 1/2]; 1: [1/4, 3/4]; 2: [1/10, 9/10]. The empty row: 0, gradient 0.
    x = torch.tensor([[0.0, math.log(3), math.nan], [5.0, 6.0, 7.0]], dtype=torch.float64)
    x.requires_grad_()
    mask = torch.tensor([[True, True, False], [False, False, False]])
    cases = {
        -2.0: (math.log(3) - math.log(5) / 2, [0.9, 0.1]),
        -1.0: (math.log(1.5), [0.75, 0.25]),
        0.0: (math.log(3) / 2, [0.5, 0.5]),
        1.0: (math.log(2), [0.25, 0.75]),
        2.0: (math.log(5) / 2, [0.1, 0.9]),
    }
    for p, (value, weights) in cases.items():
        out = masked_power_mean(x, mask, p)
        torch.testing.assert_close(out, torch.tensor([value, 0.0], dtype=torch.float64))
        (grad,) = torch.autograd.grad(out.sum(), x)
        expected = torch.tensor([[*weights, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
        torch.testing.assert_close(grad, expected)
        np.testing.assert_allclose(
            reference.masked_power_mean(x.detach().numpy(), mask.numpy(), p).value,
            [value, 0.0], rtol=1e-15, atol=0,
        )  # fmt: skip


# Regression, defect 8 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): float64 with dual_clip: the bounds were rounded to float32 on the plain path.
@pytest.mark.parametrize("dual_clip", [None, 2.0])
def test_float64_bounds_are_exact(impl: str, dual_clip: float | None) -> None:
    """eps_high = 0.28 rounds to 0.2800000011920929 in float32: r = 0.28 + 5e-10 lies above the
    float64 bound (clipped: gradient 0) and below the rounded one."""
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = torch.tensor([[0.28 + 5e-10, 0.1], [-(0.2 + 5e-10), 0.0]], dtype=torch.float64)
    logp.requires_grad_()
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    kw = {"epsilon": 0.2, "epsilon_high": 0.28, "dual_clip": dual_clip}
    out = gmpo_loss(logp, old, adv, mask, impl=impl, **kw)
    (grad,) = torch.autograd.grad(out.loss, logp)
    exp = reference.gmpo_loss(logp.detach().numpy(), old.numpy(), adv.numpy(), mask.numpy(), **kw)
    assert grad[0, 0] == 0 and grad[1, 0] == 0  # both tokens just outside their bound
    np.testing.assert_allclose(grad.numpy(), exp.grad_logp, rtol=1e-12, atol=1e-15)
    assert out.stats.num_clipped_high.item() == 1 and out.stats.num_clipped_low.item() == 1


# Regression, defect 10 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): B = 0 gave a NaN loss (now 0).
def test_empty_batch_gives_zero_loss(impl: str) -> None:
    logp = torch.zeros(0, 4, requires_grad=True)
    out = gmpo_loss(logp, torch.zeros(0, 4), torch.zeros(0), torch.ones(0, 4), impl=impl)
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert logp.grad is not None and logp.grad.shape == (0, 4)
    assert (
        reference.gmpo_loss(np.zeros((0, 4)), np.zeros((0, 4)), np.zeros(0), np.ones((0, 4))).loss
        == 0.0
    )


def test_token_weights_of_rows_without_tokens(impl: str) -> None:
    """(B, 0) weights are token weights of rows with no token, not row weights (which would need
    B values): the loss is 0 and every row's output too (found by a property test: a size error
    before)."""
    logp = torch.zeros(2, 0, requires_grad=True)
    out = gmpo_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), torch.zeros(2, 0, dtype=torch.bool),
                    is_weights=torch.zeros(2, 0), impl=impl)  # fmt: skip
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.per_sequence_loss.tolist() == [0.0, 0.0]
    assert logp.grad is not None and logp.grad.shape == (2, 0)


@pytest.mark.parametrize("shape", [(3, 4), (0, 4), (2, 0)])
def test_no_valid_token_gives_infinite_extrema_and_nan_metrics(
    impl: str, shape: tuple[int, int]
) -> None:
    """With no valid token (all masked, no rows, rows of no token), the extrema are the empty
    min and max (docs/semantics.md S10): +inf and -inf, not the largest float; the metrics'
    extrema are NaN and their fractions 0."""
    logp = torch.randn(shape)
    out = gmpo_loss(logp, logp + 1.0, torch.ones(shape[0]), torch.zeros(shape), dual_clip=2.0,
                    impl=impl)  # fmt: skip
    s, inf = out.stats, math.inf
    assert (s.log_ratio_min.item(), s.log_ratio_max.item()) == (inf, -inf)
    assert (s.row_clip_low_min.item(), s.row_clip_high_max.item()) == (inf, -inf)
    assert s.num_tokens.item() == s.num_clipped_high.item() == s.num_clipped_dual.item() == 0
    m = out.metrics
    assert all(math.isnan(m[k].item()) for k in ("log_ratio/min", "log_ratio/max",
               "clip_ratio/low_min", "clip_ratio/high_max"))  # fmt: skip
    assert m["clip_ratio/high_mean"].item() == m["clip_ratio/dual_mean"].item() == 0.0
