"""``gmpo_core.lm_head.token_logprobs`` against the materialized LM head.

The reference is the plain path in float64: ``z = (h @ W.T + b) / τ``, ``log_softmax``, gather,
and ``-(p * log p).sum(-1)`` for the entropy, differentiated by autograd. Inputs of every dtype are
compared with that reference on the same (already rounded) input values, forward and backward,
with random upstream gradients on both outputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor

import gmpo_core._gemms as _gemms
import gmpo_core.lm_head as lm_head
from gmpo_core.lm_head import DEFAULT_CHUNK_SIZE, TokenLogProbs, token_logprobs

# One tolerance table per input dtype: (rtol, atol relative to the reference's largest magnitude).
# Outputs are float32 for every input dtype (computed in float32 from the rounded inputs), so
# their tolerance is float32's; gradients come back in the inputs' dtype, so bf16 gradients carry
# one bf16 rounding (2^-8 relative).
TOL: dict[torch.dtype, dict[str, tuple[float, float]]] = {
    torch.float64: {"value": (1e-12, 1e-12), "grad": (1e-10, 1e-12)},
    torch.float32: {"value": (2e-6, 2e-6), "grad": (2e-5, 2e-6)},
    torch.bfloat16: {"value": (2e-6, 2e-6), "grad": (8e-3, 2e-5)},
}


def close(got: Tensor, ref: Tensor, dtype: torch.dtype, kind: str) -> None:
    rtol, atol = TOL[dtype][kind]
    scale = float(ref.detach().abs().max()) if ref.numel() else 1.0
    torch.testing.assert_close(
        got.double(), ref.double(), rtol=rtol, atol=atol * max(scale, 1.0), check_dtype=False
    )


def reference(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, Tensor]:
    """The materialized path, from the definitions (in ``dtype``)."""
    z = hidden.to(dtype) @ weight.to(dtype).T
    if bias is not None:
        z = z + bias.to(dtype)
    logp_all = torch.log_softmax(z / temperature, dim=-1)  # (..., V)
    logps = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropies = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropies


def make(
    n: int,
    hdim: int,
    vocab: int,
    dtype: torch.dtype,
    *,
    bias: bool,
    seed: int = 0,
    scale: float = 1.0,
) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, hdim, generator=g, dtype=torch.float64) * scale).to(dtype)
    w = (torch.randn(vocab, hdim, generator=g, dtype=torch.float64) / math.sqrt(hdim) * 3).to(dtype)
    b = torch.randn(vocab, generator=g, dtype=torch.float64).to(dtype) if bias else None
    return {
        "hidden": h.requires_grad_(),
        "weight": w.requires_grad_(),
        "bias": None if b is None else b.requires_grad_(),
        "targets": torch.randint(0, vocab, (n,), generator=g),
        "g_logp": torch.randn(n, generator=g, dtype=torch.float64),
        "g_ent": torch.randn(n, generator=g, dtype=torch.float64),
    }


def leaves(inp: dict[str, Any]) -> list[Tensor]:
    return [t for t in (inp["hidden"], inp["weight"], inp["bias"]) if t is not None]


def grads_of(
    inp: dict[str, Any], logps: Tensor, entropies: Tensor | None
) -> tuple[list[Tensor], list[Tensor | None]]:
    loss = (logps * inp["g_logp"].to(logps.dtype)).sum()
    if entropies is not None:
        loss = loss + (entropies * inp["g_ent"].to(entropies.dtype)).sum()
    ls = leaves(inp)
    return ls, list(torch.autograd.grad(loss, ls))


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the CPU row blocks and the weight-upcast blocks tiny so that tests at small V take
    every loop path (several row blocks per chunk, a ragged last one; several vocab blocks)."""
    monkeypatch.setattr(lm_head, "_SCRATCH_BYTES", 3 * 8 * 51)  # 3 rows of V = 51 in float64
    monkeypatch.setattr(_gemms, "VOCAB_BLOCK", 16)
    yield


# ---------------------------------------------------------------------------------------------
# equality with the materialized path


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize(
    ("n", "chunk_size"),
    [(37, 8), (5, 16), (32, 32), (13, 1)],
    ids=["ragged", "n<chunk", "n=chunk", "chunk=1"],
)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_matches_materialized(
    dtype: torch.dtype, n: int, chunk_size: int, temperature: float, bias: bool
) -> None:
    inp = make(n, 24, 51, dtype, bias=bias)
    out = token_logprobs(
        inp["hidden"], inp["weight"], inp["targets"],
        bias=inp["bias"], temperature=temperature, chunk_size=chunk_size,
    )  # fmt: skip
    assert isinstance(out, TokenLogProbs) and out.entropies is not None
    assert out.logps.dtype == out.entropies.dtype == torch.promote_types(dtype, torch.float32)
    assert out.logps.shape == out.entropies.shape == (n,)
    _, got = grads_of(inp, out.logps, out.entropies)

    ref_lp, ref_ent = reference(
        inp["hidden"], inp["weight"], inp["targets"], inp["bias"], temperature
    )
    ls, want = grads_of(inp, ref_lp, ref_ent)
    close(out.logps, ref_lp, dtype, "value")
    close(out.entropies, ref_ent, dtype, "value")
    for leaf, g, w in zip(ls, got, want, strict=True):
        assert g is not None and w is not None and g.dtype == leaf.dtype
        close(g, w, dtype, "grad")


def test_bf16_is_more_accurate_than_materialized_bf16() -> None:
    """Logits are computed in float32 from bf16 inputs, never rounded to bf16: our log-probs and
    entropies are closer to the float64 values than the materialized path run in bf16."""
    inp = make(64, 64, 300, torch.bfloat16, bias=False, scale=3.0)
    args = (inp["hidden"], inp["weight"], inp["targets"])
    ours = token_logprobs(*args, chunk_size=16)
    exact = reference(*args)
    bf16 = reference(*args, dtype=torch.bfloat16)
    assert ours.entropies is not None
    for o, r, b in zip((ours.logps, ours.entropies), exact, bf16, strict=True):
        err_ours = (o.double() - r).abs().max()
        err_bf16 = (b.double() - r).abs().max()
        assert err_ours < 1e-4 < err_bf16


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("which", ["logps_only", "entropies_only", "no_entropy_output"])
def test_single_upstream_gradient(which: str) -> None:
    """Each output's gradient alone (autograd hands the backward None for the unused one)."""
    inp = make(19, 12, 51, torch.float64, bias=True)
    out = token_logprobs(
        inp["hidden"], inp["weight"], inp["targets"], bias=inp["bias"], temperature=1.3,
        logit_scale=0.5, chunk_size=7, compute_entropy=which != "no_entropy_output",
    )  # fmt: skip
    # s·y/τ with s = 0.5, τ = 1.3 is y/τ' with τ' = 2.6
    ref_lp, ref_ent = reference(inp["hidden"], inp["weight"], inp["targets"], inp["bias"], 2.6)
    if which == "no_entropy_output":
        assert out.entropies is None
    if which == "entropies_only":
        assert out.entropies is not None
        got_loss, ref_loss = (out.entropies * inp["g_ent"]).sum(), (ref_ent * inp["g_ent"]).sum()
    else:
        got_loss, ref_loss = (out.logps * inp["g_logp"]).sum(), (ref_lp * inp["g_logp"]).sum()
    got = torch.autograd.grad(got_loss, leaves(inp))
    want = torch.autograd.grad(ref_loss, leaves(inp))
    for g, w in zip(got, want, strict=True):
        close(g, w, torch.float64, "grad")


@pytest.mark.usefixtures("small_blocks")
def test_frozen_head_with_bf16_hidden() -> None:
    """A frozen float32 head (LoRA) under bf16 hidden states: only ``hidden`` gets a gradient,
    in bf16, and no weight gradient is formed."""
    inp = make(21, 16, 51, torch.float32, bias=False)
    h = inp["hidden"].detach().to(torch.bfloat16).requires_grad_()
    w = inp["weight"].detach()
    out = token_logprobs(h, w, inp["targets"], chunk_size=8)
    assert out.entropies is not None
    loss = (out.logps * inp["g_logp"].float()).sum() + (out.entropies * inp["g_ent"].float()).sum()
    (got,) = torch.autograd.grad(loss, h)
    ref_lp, ref_ent = reference(h, w, inp["targets"])
    (want,) = torch.autograd.grad(
        (ref_lp * inp["g_logp"]).sum() + (ref_ent * inp["g_ent"]).sum(), h
    )
    assert got.dtype == torch.bfloat16
    close(got, want, torch.bfloat16, "grad")


def test_default_settings_and_batched_shape() -> None:
    """(B, T, H) hidden states with (B, T) targets, default chunking and block sizes."""
    inp = make(2 * 300, 32, 1000, torch.float32, bias=False)
    h3 = inp["hidden"].detach().reshape(2, 300, 32).requires_grad_()
    t2 = inp["targets"].reshape(2, 300)
    logps, entropies = token_logprobs(h3, inp["weight"], t2)
    assert logps.shape == (2, 300) and entropies is not None and entropies.shape == (2, 300)
    assert DEFAULT_CHUNK_SIZE < 600  # so two or more chunks ran
    loss = (logps * inp["g_logp"].reshape(2, 300)).sum() + (
        entropies * inp["g_ent"].reshape(2, 300)
    ).sum()
    got = torch.autograd.grad(loss, [h3, inp["weight"]])
    ref_lp, ref_ent = reference(h3, inp["weight"], t2)
    ref_loss = (ref_lp * inp["g_logp"].reshape(2, 300)).sum() + (
        ref_ent * inp["g_ent"].reshape(2, 300)
    ).sum()
    want = torch.autograd.grad(ref_loss, [h3, inp["weight"]])
    close(logps, ref_lp, torch.float32, "value")
    close(entropies, ref_ent, torch.float32, "value")
    for g, w in zip(got, want, strict=True):
        close(g, w, torch.float32, "grad")


def test_hand_worked_two_token_vocabulary() -> None:
    """V = 2, logits z = (0, log 3): p = (1/4, 3/4).

    logp(y=1) = log(3/4) = -0.28768...; H = -(1/4·log(1/4) + 3/4·log(3/4)) = 0.56233...
    dlogp/dz = onehot - p = (-1/4, 1/4); dH/dz = -p·(log p + H):
      dH/dz_0 = -1/4·(log(1/4) + 0.56233) = 0.20599..., dH/dz_1 = -0.20599... (sums to 0).
    With h = (1,), W = ((0,), (log 3,)): z = W h, so dL/dh = dL/dz · W[:, 0] = dL/dz_1 · log 3.
    """
    h = torch.ones(1, 1, dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[0.0], [math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    logps, entropies = token_logprobs(h, w, torch.tensor([1]))
    assert entropies is not None
    ent = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert logps.item() == pytest.approx(math.log(0.75), rel=1e-14)
    assert entropies.item() == pytest.approx(ent, rel=1e-14)
    (gh_l,) = torch.autograd.grad(logps.sum(), h, retain_graph=True)
    assert gh_l.item() == pytest.approx(0.25 * math.log(3.0), rel=1e-14)
    gh_e, gw_e = torch.autograd.grad(entropies.sum(), [h, w])
    dh_dz1 = -0.75 * (math.log(0.75) + ent)
    assert dh_dz1 == pytest.approx(-0.25 * (math.log(0.25) + ent) * -1, rel=1e-12)
    assert gh_e.item() == pytest.approx(dh_dz1 * math.log(3.0), rel=1e-12)
    assert gw_e[:, 0].tolist() == pytest.approx([-dh_dz1, dh_dz1], rel=1e-12)


def test_gradcheck_float64() -> None:
    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 7, (5,), generator=g)

    def fn(h: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor | None]:
        return tuple(token_logprobs(h, w, t, bias=b, temperature=0.8, chunk_size=2))  # type: ignore[return-value]

    assert torch.autograd.gradcheck(fn, (h, w, b))


def test_large_logits_stay_finite() -> None:
    """Logits in the hundreds (no overflow: the row max is subtracted before exp)."""
    inp = make(9, 8, 51, torch.float32, bias=False, scale=60.0)
    out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"], chunk_size=4)
    ref_lp, ref_ent = reference(inp["hidden"], inp["weight"], inp["targets"])
    assert float((inp["hidden"] @ inp["weight"].T).detach().abs().max()) > 200
    assert out.entropies is not None
    assert torch.isfinite(out.logps).all() and torch.isfinite(out.entropies).all()
    close(out.logps, ref_lp, torch.float32, "value")
    close(out.entropies, ref_ent, torch.float32, "value")


def test_autocast_does_not_lower_precision() -> None:
    """Under a bf16 autocast the head still computes in float32 (as without autocast)."""
    inp = make(20, 16, 51, torch.float32, bias=False)
    args = (inp["hidden"], inp["weight"], inp["targets"])
    plain = token_logprobs(*args, chunk_size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = token_logprobs(*args, chunk_size=8)
    assert auto.logps.dtype == torch.float32
    torch.testing.assert_close(auto.logps, plain.logps, rtol=0, atol=0)


def test_empty_input_keeps_graph() -> None:
    w = torch.randn(11, 4, requires_grad=True)
    h = torch.randn(0, 4, requires_grad=True)
    logps, entropies = token_logprobs(h, w, torch.zeros(0, dtype=torch.long))
    assert logps.shape == (0,) and entropies is not None and entropies.shape == (0,)
    (gw,) = torch.autograd.grad(logps.sum(), w)
    assert (gw == 0).all()


def test_no_input_needs_grad() -> None:
    inp = make(6, 4, 51, torch.float32, bias=False)
    with torch.no_grad():
        out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"])
    assert not out.logps.requires_grad


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"logit_scale": -1.0}, "logit_scale"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 2.0}, "chunk_size"),
        ({"bias": torch.zeros(5)}, "bias"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        token_logprobs(
            torch.randn(3, 4), torch.randn(7, 4), torch.zeros(3, dtype=torch.long), **kwargs
        )


@pytest.mark.parametrize(
    ("h", "w", "t", "match"),
    [
        ((3, 4), (7, 5), (3,), "hidden must be"),
        ((3, 4), (7, 4), (4,), "targets must have"),
        ((3, 4), (7, 4, 1), (3,), "weight must be"),
    ],
)
def test_bad_shapes(h: tuple[int, ...], w: tuple[int, ...], t: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        token_logprobs(torch.randn(*h), torch.randn(*w), torch.zeros(t, dtype=torch.long))


def test_bad_target_dtype() -> None:
    with pytest.raises(ValueError, match="integer token ids"):
        token_logprobs(torch.randn(3, 4), torch.randn(7, 4), torch.zeros(3))


# ---------------------------------------------------------------------------------------------
# differential: TRL's own chunked LM head


@pytest.mark.trl
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_matches_trl_chunked_logprob(bias: bool) -> None:
    """Same values and gradients as ``trl.kernels.ChunkedLogProbFunction`` (GRPOTrainer's head).

    No difference on purpose: TRL computes the entropy as lse − E_p[z] and we as
    log Σexp(z − max) + E_p[max − z] (two non-negative terms), equal up to float32 rounding.
    """
    kernels = pytest.importorskip("trl.kernels")
    inp = make(45, 32, 300, torch.float32, bias=bias)
    args = (inp["hidden"], inp["weight"], inp["targets"])
    ours = token_logprobs(*args, bias=inp["bias"], temperature=0.9, logit_scale=1.7, chunk_size=16)
    trl_out = kernels.ChunkedLogProbFunction.apply(
        inp["hidden"], inp["weight"], inp["bias"], inp["targets"], 0.9, 128, None, 1.7, ("entropy",)
    )
    assert ours.entropies is not None
    close(ours.logps, trl_out[0], torch.float32, "value")
    close(ours.entropies, trl_out[1], torch.float32, "value")
    _, got = grads_of(inp, ours.logps, ours.entropies)
    _, want = grads_of(inp, trl_out[0], trl_out[1])
    for g, w in zip(got, want, strict=True):
        assert g is not None and w is not None
        close(g, w, torch.float32, "grad")


# Regression, defect 9 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): token_logprobs returned NaN entropies (and gradients) where a logit is -inf.
def test_token_logprobs_with_masked_vocabulary() -> None:
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(10, 8, generator=g, dtype=torch.float64)
    bias = torch.zeros(10, dtype=torch.float64)
    bias[3:6] = -math.inf  # vocabulary masking
    targets = torch.tensor([0, 1, 2, 6, 7, 9])
    logps, entropies = token_logprobs(hidden, weight, targets, bias=bias)
    # expected: the same distribution over the entries that are not masked (they have p = 0)
    keep = bias.isfinite()
    log_p = torch.log_softmax(hidden @ weight[keep].T + bias[keep], -1)
    kept_targets = (torch.cumsum(keep, 0) - 1)[targets]
    expected_logps = log_p.gather(1, kept_targets[:, None]).squeeze(1)
    expected_h = -(log_p.exp() * log_p).sum(-1)
    torch.testing.assert_close(entropies, expected_h)
    torch.testing.assert_close(logps, expected_logps)
    (logps.sum() + entropies.sum()).backward()
    (expected,) = torch.autograd.grad(expected_logps.sum() + expected_h.sum(), hidden)
    torch.testing.assert_close(hidden.grad, expected)
