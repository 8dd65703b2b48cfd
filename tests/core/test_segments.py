"""Packed input (``cu_seqlens``) beyond the properties: validation, the building blocks, a
user's ``torch.compile``, the end-to-end path from packed hidden states, and edge cases."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounter

from gmpo_core import (
    clip_metrics,
    gmpo_loss,
    masked_geometric_mean,
    masked_power_mean,
    sequence_kl,
    token_logprobs,
    trust_region_log_ratio,
)


def _padded(seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Five rows of lengths 3, 0, 7, 1, 5 (one empty), holes inside, an A = 0 row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([3, 0, 7, 1, 5])
    b, t = len(lengths), int(lengths.max())
    keep = torch.arange(t)[None, :] < lengths[:, None]
    logp = -torch.rand(b, t, generator=g, dtype=dtype) * 2
    return {
        "logp": logp,
        "old_logp": logp + 0.5 * torch.randn(b, t, generator=g, dtype=dtype),
        "advantages": torch.tensor([1.0, -1.0, -0.5, 0.0, 2.0], dtype=dtype),
        "mask": keep & (torch.rand(b, t, generator=g) > 0.2),
        "keep": keep,
    }


def _packed(x: dict[str, Any]) -> dict[str, Any]:
    keep = x["keep"]
    cu = torch.zeros(len(keep) + 1, dtype=torch.int64)
    cu[1:] = keep.sum(1).cumsum(0)
    return {
        "logp": x["logp"][keep],
        "old_logp": x["old_logp"][keep],
        "advantages": x["advantages"],
        "mask": x["mask"][keep],
        "cu_seqlens": cu,
    }


# validation -----------------------------------------------------------------------------------


def test_cu_seqlens_shape_and_dtype_are_always_checked() -> None:
    p = _packed(_padded())
    with pytest.raises(ValueError, match=r"cu_seqlens must be a 1-D int32 or int64 tensor"):
        gmpo_loss(**{**p, "cu_seqlens": p["cu_seqlens"].float()})
    with pytest.raises(ValueError, match=r"cu_seqlens must be a 1-D int32 or int64 tensor"):
        gmpo_loss(**{**p, "cu_seqlens": p["cu_seqlens"][None]})
    with pytest.raises(ValueError, match=r"length len\(advantages\) \+ 1 = 6"):
        gmpo_loss(**{**p, "cu_seqlens": p["cu_seqlens"][:-1]})
    with pytest.raises(ValueError, match=r"cu_seqlens must be a tensor"):
        gmpo_loss(**{**p, "cu_seqlens": [0, 3, 3, 10, 11, 16]})
    with pytest.raises(ValueError, match=r"logp must have shape \(N,\)"):
        gmpo_loss(**{**p, "logp": p["logp"][None]})
    with pytest.raises(ValueError, match=r"old_logp must have the shape of logp"):
        gmpo_loss(**{**p, "old_logp": p["old_logp"][:-1]})
    with pytest.raises(ValueError, match=r"mask must have the shape of logp"):
        gmpo_loss(**{**p, "mask": p["mask"][:-1]})
    with pytest.raises(ValueError, match=r"is_weights must have shape \(N,\)"):
        gmpo_loss(**p, is_weights=torch.ones(5))  # (S,) is ambiguous: not accepted
    with pytest.raises(ValueError, match=r"cu_seqlens is on device meta"):
        gmpo_loss(**{**p, "cu_seqlens": p["cu_seqlens"].to("meta")})


@pytest.mark.parametrize(
    ("values", "rule"),
    [
        ([1, 3, 3, 10, 11, 16], "start at 0 and end at N"),
        ([0, 3, 3, 10, 11, 15], "start at 0 and end at N"),
        ([0, 3, 2, 10, 11, 16], "non-decreasing"),
    ],
)
def test_cu_seqlens_values_are_checked_on_request(values: list[int], rule: str) -> None:
    p = {**_packed(_padded()), "cu_seqlens": torch.tensor(values)}
    with pytest.raises(ValueError, match=rule):
        gmpo_loss(**p, check_values=True)
    out = gmpo_loss(**p)  # unchecked: no sync, no error, no out-of-bounds access
    assert out.per_sequence_loss.shape == (5,)


# edge cases -----------------------------------------------------------------------------------


@pytest.mark.parametrize("s", [0, 3])
def test_no_tokens_at_all(impl: str, s: int) -> None:
    """N = 0 (S empty segments, or none): the padded (S, 0) call's result."""
    logp = torch.zeros(0, requires_grad=True)
    out = gmpo_loss(logp, torch.zeros(0), torch.ones(s), torch.zeros(0, dtype=torch.bool),
                    cu_seqlens=torch.zeros(s + 1, dtype=torch.int32), impl=impl)  # fmt: skip
    pad = gmpo_loss(torch.zeros(s, 0), torch.zeros(s, 0), torch.ones(s), torch.zeros(s, 0) > 0)
    assert out.loss.item() == 0.0 and out.per_sequence_loss.shape == (s,)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad.shape == (0,)
    for k, v in pad.metrics.items():
        torch.testing.assert_close(out.metrics[k], v, equal_nan=True, msg=k)


# building blocks ------------------------------------------------------------------------------


def test_building_blocks_take_segments() -> None:
    x = _padded(1)
    p = _packed(x)
    keep, cu = x["keep"], p["cu_seqlens"]
    r = x["logp"] - x["old_logp"]
    torch.testing.assert_close(
        masked_geometric_mean(r[keep], p["mask"], cu_seqlens=cu),
        masked_geometric_mean(r, x["mask"]),
    )
    for power in (-1.0, 0.0, 1e-6, 2.0, 1e-30):  # and their gradients
        rr = r.detach().requires_grad_()
        packed = masked_power_mean(rr[keep], p["mask"], power, cu_seqlens=cu)
        padded = masked_power_mean(rr, x["mask"], power)
        torch.testing.assert_close(packed, padded, msg=f"p={power}")
        ups = torch.randn(len(padded))
        (g_packed,) = torch.autograd.grad(packed, rr, ups)
        (g_padded,) = torch.autograd.grad(padded, rr, ups)
        torch.testing.assert_close(g_packed, g_padded, msg=f"p={power}")
    ref = x["old_logp"] - 0.3
    torch.testing.assert_close(
        sequence_kl(x["logp"][keep], ref[keep], p["mask"], cu_seqlens=cu),
        sequence_kl(x["logp"], ref, x["mask"]),
    )
    tr = trust_region_log_ratio(r[keep], x["advantages"], cu_seqlens=cu, dual_clip=2.0)
    torch.testing.assert_close(tr, trust_region_log_ratio(r, x["advantages"], dual_clip=2.0)[keep])
    a = clip_metrics(r[keep], x["advantages"], p["mask"], cu_seqlens=cu, epsilon=0.2)
    b = clip_metrics(r, x["advantages"], x["mask"], epsilon=0.2)
    for key, value in b.metrics().items():
        torch.testing.assert_close(a.metrics()[key], value, equal_nan=True, msg=key)
    with pytest.raises(ValueError, match=r"log_values must have shape \(N,\)"):
        masked_geometric_mean(r, x["mask"], cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"length len\(advantages\) \+ 1"):
        trust_region_log_ratio(r[keep], x["advantages"][:-1], cu_seqlens=cu)


# torch.compile ----------------------------------------------------------------------------


def test_packed_loss_traces_into_a_user_graph_without_breaks() -> None:
    counter = CompileCounter()

    def step(x: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        out = gmpo_loss(**x, beta=0.04, epsilon_high=0.28)
        return out.loss, out.metrics["clip_ratio/high_mean"]

    fn = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    for seed in (0, 1):
        x = _padded(seed)
        if seed == 1:  # another N and S
            x = {k: v[1:] for k, v in x.items()}
        p = _packed(x)
        p["ref_logp"] = p["old_logp"] - 0.1
        p["logp"].requires_grad_()
        loss, high = fn(p)
        (grad,) = torch.autograd.grad(loss, p["logp"])
        expected = gmpo_loss(**p, beta=0.04, epsilon_high=0.28)
        (expected_grad,) = torch.autograd.grad(expected.loss, p["logp"])
        torch.testing.assert_close(loss, expected.loss)
        torch.testing.assert_close(high, expected.metrics["clip_ratio/high_mean"])
        torch.testing.assert_close(grad, expected_grad)
    assert counter.frame_count == 1


# end to end from hidden states ----------------------------------------------------------------


def test_packed_hidden_states_to_loss_equal_padded() -> None:
    """hidden -> token_logprobs -> gmpo_loss on packed (N, H) hidden states equals the padded
    (B, T, H) path: loss, and the gradients reaching the hidden states and the LM-head weight."""
    g = torch.Generator().manual_seed(3)
    x = _padded(2, torch.float64)
    keep = x["keep"]
    b, t = keep.shape
    hid, vocab = 16, 50
    hidden = torch.randn(b, t, hid, generator=g, dtype=torch.float64)
    weight = (0.3 * torch.randn(vocab, hid, generator=g, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, vocab, (b, t), generator=g)
    old = x["old_logp"]
    results = []
    for packed in (False, True):
        h = (hidden[keep] if packed else hidden).clone().requires_grad_()
        logps, _ = token_logprobs(h, weight, targets[keep] if packed else targets, chunk_size=7)
        if packed:
            out = gmpo_loss(logps, old[keep], x["advantages"], x["mask"][keep],
                            cu_seqlens=_packed(x)["cu_seqlens"], epsilon_high=0.28)  # fmt: skip
        else:
            out = gmpo_loss(logps, old, x["advantages"], x["mask"], epsilon_high=0.28)
        gh, gw = torch.autograd.grad(out.loss, (h, weight))
        results.append((out.loss, gh if packed else gh[keep], gw))
    (loss_pad, gh_pad, gw_pad), (loss_pk, gh_pk, gw_pk) = results
    torch.testing.assert_close(loss_pk, loss_pad, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(gh_pk, gh_pad, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(gw_pk, gw_pad, rtol=1e-12, atol=1e-15)
    assert gw_pad.abs().sum() > 0


# accuracy and exact counts of long segments ---------------------------------------------------


def _one_segment(n: int, clipped: int) -> dict[str, Any]:
    """One segment of ``n`` tokens: log-ratio 0.3 on the first ``clipped`` (above epsilon =
    0.2: clipped), 0.1 on the rest."""
    logp = torch.full((n,), -1.0)
    r = torch.full((n,), 0.1)
    r[:clipped] = 0.3
    return {
        "logp": logp.requires_grad_(),
        "old_logp": logp.detach() - r,
        "advantages": torch.tensor([1.0]),
        "mask": torch.ones(n, dtype=torch.bool),
        "cu_seqlens": torch.tensor([0, n]),
        "epsilon": 0.2,
    }


@pytest.mark.parametrize("segments", [1, 2])
def test_a_long_segment_sums_accurately(impl: str, segments: int) -> None:
    """Defect: packed row sums were sequential float32 (``torch.segment_reduce``): one segment of
    131,072 tokens with every log-ratio 0.3 (epsilon 0.2) gave ``log_coef`` a relative error of
    1e-3, where the padded row gives 1.6e-7. Bound: 1e-6. (Two segments: the compiled path runs
    compiled only where there is more than one row.)"""
    n = 131_072
    x = _one_segment(n, clipped=n)
    if segments == 2:
        x.update(
            logp=torch.cat([x["logp"].detach(), x["logp"].detach()]).requires_grad_(),
            old_logp=torch.cat([x["old_logp"], x["old_logp"]]),
            advantages=torch.tensor([1.0, 2.0]),
            mask=torch.ones(2 * n, dtype=torch.bool),
            cu_seqlens=torch.tensor([0, n, 2 * n]),
        )
    out = gmpo_loss(**x, impl=impl)
    want = torch.tensor(0.2, dtype=torch.float32).double()  # every token clipped to epsilon
    err = ((out.log_coef.double() - want).abs() / want).max().item()
    assert err <= 1e-6, err
    assert out.stats.num_clipped_high.item() == segments * n


@pytest.mark.slow
def test_counts_stay_exact_past_float32_integers() -> None:
    """Defect: one segment of 2^24 + 2^21 tokens (18.9M) reported ``num_tokens`` = 16,777,216
    (2^24) and a wrong ``log_coef``, gradient and clip counts. A few seconds, about 1 GB."""
    n, clipped = 2**24 + 2**21, 2**23 + 3
    x = _one_segment(n, clipped)
    out = gmpo_loss(**x)
    out.loss.backward()
    assert out.stats.num_tokens.item() == n
    assert out.stats.num_clipped_high.item() == clipped
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).double()  # noqa: E731
    want = (clipped * f32(0.2) + (n - clipped) * (f32(-1.0) - (f32(-1.0) - f32(0.1)))) / n
    err = abs(out.log_coef.double().item() - want.item()) / want.item()
    assert err <= 1e-6, err
    grad = x["logp"].grad
    # d loss / d logp_t = -A exp(log_coef) / n where the token is not clipped, 0 where it is
    assert torch.count_nonzero(grad[:clipped]).item() == 0
    expected = -torch.exp(want) / n
    torch.testing.assert_close(
        grad[clipped:].double(), expected.expand(n - clipped), rtol=1e-5, atol=0
    )


# cu_seqlens without segments -------------------------------------------------------------------


def test_no_segments_with_tokens_is_refused(impl: str) -> None:
    """Defect: ``cu_seqlens=tensor([0])`` (no segments) with 5 tokens passed validation and
    raised ``IndexError`` inside ``index_select`` (on CUDA a device-side assert)."""
    p = {
        "logp": torch.zeros(5, requires_grad=True),
        "old_logp": torch.zeros(5),
        "advantages": torch.zeros(0),
        "mask": torch.ones(5, dtype=torch.bool),
        "cu_seqlens": torch.tensor([0]),
    }
    with pytest.raises(ValueError, match=r"cu_seqlens has no segment .* N = 5 tokens"):
        gmpo_loss(**p, impl=impl)
    with pytest.raises(ValueError, match=r"cu_seqlens has no segment"):
        trust_region_log_ratio(p["old_logp"], p["advantages"], cu_seqlens=p["cu_seqlens"])


@settings(max_examples=200)
@given(
    n=st.integers(0, 12),
    bounds=st.lists(st.integers(-20, 20), min_size=1, max_size=6),
    impl=st.sampled_from(["plain", "compiled"]),
)
def test_no_cu_seqlens_value_indexes_out_of_range(n: int, bounds: list[int], impl: str) -> None:
    """Whatever values ``cu_seqlens`` holds (out of [0, N], decreasing, not ending at N), no
    kernel indexes out of range: on CPU that would raise IndexError (on CUDA, a device-side
    assert). Their values are refused only with ``check_values=True``."""
    s = len(bounds) - 1
    g = torch.Generator().manual_seed(n * 31 + s)
    logp = torch.randn(n, generator=g).requires_grad_()
    args = {
        "old_logp": torch.randn(n, generator=g),
        "advantages": torch.randn(s, generator=g),
        "mask": torch.ones(n, dtype=torch.bool),
        "cu_seqlens": torch.tensor(bounds),
    }
    if s == 0 and n > 0:  # tokens without a segment: refused by the shape check
        with pytest.raises(ValueError, match="cu_seqlens has no segment"):
            gmpo_loss(logp, **args, impl=impl)
        return
    out = gmpo_loss(logp, **args, impl=impl)
    out.loss.backward()
    assert out.per_sequence_loss.shape == (s,) and logp.grad is not None
    trust_region_log_ratio(args["old_logp"], args["advantages"], cu_seqlens=args["cu_seqlens"])
    clip_metrics(args["old_logp"], args["advantages"], args["mask"], cu_seqlens=args["cu_seqlens"])


# second-order gradients and forward mode ------------------------------------------------------


def _transform_case(packed: bool, impl: str) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """``per_sequence_loss`` as a function of ``logp`` (float64, with the KL term for curvature,
    a dual clip and token weights), the point and a tangent: padded (B, T) or packed (N,)."""
    x = _padded(4, torch.float64)
    g = torch.Generator().manual_seed(5)
    shape = x["keep"].shape
    x["ref_logp"] = x["logp"] - 0.3 * torch.rand(shape, generator=g, dtype=torch.float64)
    x["is_weights"] = 0.5 + torch.rand(shape, generator=g, dtype=torch.float64)
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    keep = x.pop("keep")
    if packed:
        x = {**_packed({**x, "keep": keep}), "ref_logp": x["ref_logp"][keep],
             "is_weights": x["is_weights"][keep]}  # fmt: skip
        v = v[keep]
    logp = x.pop("logp")
    kw = {"beta": 0.05, "dual_clip": 2.0, "epsilon": 0.2, "impl": impl}

    def f(lp: torch.Tensor) -> torch.Tensor:
        return gmpo_loss(lp, **x, **kw).per_sequence_loss

    return f, logp, v


def _padded_and_packed(impl: str, how: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``how(f, logp, v)`` on the padded rows (at their real tokens, where a token-shaped
    result) and on the same rows packed."""
    keep = _padded(4)["keep"]
    pad = how(*_transform_case(False, impl))
    pk = how(*_transform_case(True, impl))
    return (pad[keep] if pad.shape == keep.shape else pad), pk


def _hvp_create_graph(f: Any, logp: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    leaf = logp.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(leaf).sum(), leaf, create_graph=True)
    (hvp,) = torch.autograd.grad((g * v).sum(), leaf)
    return hvp


def _hvp_func(f: Any, logp: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.func.jvp(torch.func.grad(lambda lp: f(lp).sum()), (logp,), (v,))[1]


def _jvp_func(f: Any, logp: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.func.jvp(f, (logp,), (v,))[1]


@pytest.mark.parametrize(
    "how", [_hvp_create_graph, _hvp_func, _jvp_func], ids=["create_graph", "func-hvp", "func-jvp"]
)
def test_second_order_and_forward_mode_packed_equal_padded(impl: str, how: Any) -> None:
    """(CHANGELOG, 0.2): on packed input ``create_graph=True`` and torch.func HVPs raised
    "derivative for aten::_segment_reduce_backward is not implemented", ``torch.func.jvp``
    "Trying to use forward AD with segment_reduce that does not support it"; the padded call on
    the same rows worked. Packed row sums no longer use ``segment_reduce``."""
    if how is not _hvp_create_graph and not hasattr(torch.func, "debug_unwrap"):
        pytest.skip(f"torch {torch.__version__} has no torch.func.debug_unwrap")
    pad, pk = _padded_and_packed(impl, how)
    assert pad.abs().sum() > 0
    torch.testing.assert_close(pk, pad, rtol=1e-12, atol=1e-14)
