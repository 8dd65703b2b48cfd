"""The compiled path compiles once per input signature, whatever the sizes (S14: "a new (B, T)
does not recompile"): rows past 4096 tokens up to 32k, batches of thousands of rows, packed input
of any N and S, and first calls whose sizes happen to be equal. Each test counts the compilations
of the compiled path's own ``torch.compile`` call."""

from __future__ import annotations

import itertools
import types
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from gmpo_core import compiled, gmpo_loss
from tests._helpers import loss_inputs


def _counting(monkeypatch: pytest.MonkeyPatch, backend: str) -> CompileCounterWithBackend:
    """The compiled path's own ``torch.compile`` call (``compiled.compiled_forward`` as
    written), with a counter in front of ``backend``: its ``frame_count`` is the number of
    compilations. It compiles a copy of the function under a name of its own: Dynamo keeps its
    compilations (and its limit of 8) per code object, and what it learnt of the sizes (which
    it made dynamic) per file, line and name, so that other tests' compilations of
    ``_math.forward`` neither count here nor shape the compilations here."""
    counter = CompileCounterWithBackend(backend)
    real = torch.compile

    def counted(fn: Any, **kw: Any) -> Any:
        code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_counted_{next(_COUNTED)}")
        copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__)
        return real(copy, **{**kw, "backend": counter})

    with monkeypatch.context() as m:
        m.setattr(torch, "compile", counted)
        fn = compiled.compiled_forward.__wrapped__()  # type: ignore[attr-defined]
    monkeypatch.setattr(compiled, "compiled_forward", lambda: fn)
    return counter


_COUNTED = itertools.count()


def _packed(lengths: tuple[int, ...], seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    logp = -torch.rand(n, generator=g)
    return {
        "logp": logp.requires_grad_(),
        "old_logp": logp.detach() + 0.3 * torch.randn(n, generator=g),
        "advantages": torch.randn(len(lengths), generator=g),
        "mask": torch.rand(n, generator=g) > 0.2,
        "cu_seqlens": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
    }


def _same_as_plain(x: dict[str, Any]) -> None:
    """The compiled call of ``x`` against the plain one: loss, counts and gradient."""
    out = gmpo_loss(**x, impl="compiled", epsilon_high=0.28)
    (grad,) = torch.autograd.grad(out.loss, x["logp"])
    expected = gmpo_loss(**x, impl="plain", epsilon_high=0.28)
    (expected_grad,) = torch.autograd.grad(expected.loss, x["logp"])
    torch.testing.assert_close(out.loss, expected.loss)
    assert out.stats.num_tokens == expected.stats.num_tokens
    assert out.stats.num_clipped_high == expected.stats.num_clipped_high
    torch.testing.assert_close(grad, expected_grad)


# Regression (CHANGELOG, Unreleased): against S14 ("a new (B, T) does not recompile"),
# Inductor's CPU code guarded its float32 sums on the first call's sizes (<= 4096 or > 4096
# elements), so (3, 5) then (3, 4100) compiled again, and so did (5000, 3); packed input
# compiled again at S = 2 after S = 3 (a slice of size S - 1 specialized at 1).
def test_new_sizes_do_not_recompile_with_inductor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real compiler (Inductor, where the guards arose) over the sizes of reasoning RL:
    rows past 4096 tokens up to 32k, batches past 4096 rows: one compilation."""
    counter = _counting(monkeypatch, "inductor")
    for b, t in ((3, 5), (3, 4100), (5000, 3), (2, 32768)):
        _same_as_plain(loss_inputs(b, t, seed=t))
        assert counter.frame_count == 1, (b, t)


def test_new_segment_counts_do_not_recompile_with_inductor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = _counting(monkeypatch, "inductor")
    for lengths in ((4, 5, 6), (3, 7), (5000, 3), (2, 4100, 9, 1)):
        _same_as_plain(_packed(lengths, seed=len(lengths)))
        assert counter.frame_count == 1, lengths


@pytest.mark.skipif(
    not hasattr(getattr(torch.compiler, "config", None), "dynamic_sources"),
    reason="this torch has no torch.compiler.config.dynamic_sources: sizes stay duck-sized",
)
def test_equal_sizes_at_the_first_call_do_not_recompile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first batch with B = T (or packed with N = S) made one symbol of both sizes ("duck
    sizing"), and the next batch with B != T compiled again."""
    counter = _counting(monkeypatch, "eager")
    for b, t in ((4, 4), (3, 5), (6, 2)):
        _same_as_plain(loss_inputs(b, t, seed=b))
        assert counter.frame_count == 1, (b, t)
    for lengths in ((1, 1, 1), (2, 3), (4, 2, 2, 1)):  # N = S = 3 first
        _same_as_plain(_packed(lengths, seed=len(lengths)))
        assert counter.frame_count == 2, lengths  # packed input: a signature of its own
