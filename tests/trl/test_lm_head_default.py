"""``gmpo_lm_head`` is on by default; where gmpo_core's head does not apply, TRL's is used and a
warning says so once per reason."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("trl")

import torch
import trl

from gmpo_trl import GMPOConfig, compat
from gmpo_trl import head_swap as lm_head
from gmpo_trl.head_swap import TokenLogProbHead
from tests.trl._support import loss_and_grad, make_inputs, make_trainer

pytestmark = pytest.mark.trl


def test_default_is_on_and_scores_with_gmpo_core(tmp_path, monkeypatch):
    """On a TRL whose chunked head gmpo_core stands in for (1.16), the loss step's scoring pass
    runs gmpo_core's head; on an older one (1.10: another interface, and full logits by default)
    it warns once, naming the TRL, that TRL's head scored the tokens: never a silent no-op."""
    assert GMPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).gmpo_lm_head is True
    calls = []
    original = lm_head.token_logprobs

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs.get("compute_entropy"))
        return original(*args, **kwargs)

    trainer = make_trainer(tmp_path)  # no gmpo_lm_head given
    inputs = make_inputs(trainer, drift=0.5)
    monkeypatch.setattr(lm_head, "token_logprobs", counting)
    monkeypatch.setattr(TokenLogProbHead, "warned", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loss_and_grad(trainer, inputs)
        loss_and_grad(trainer, inputs)
    used_trls = [
        str(w.message) for w in seen if "gmpo_lm_head=True has no effect" in str(w.message)
    ]
    if compat.chunked_head_unsupported() is None:
        assert calls == [True, True]  # the loss step's scoring passes, with entropies
        assert used_trls == []
    else:
        assert calls == []
        assert len(used_trls) == 1, used_trls  # once per process
        assert f"trl {trl.__version__}" in used_trls[0] and "TRL's LM head" in used_trls[0]


def _apply(softcap, outputs):  # type: ignore[no-untyped-def]
    hidden, weight = torch.randn(3, 4), torch.randn(6, 4)
    labels = torch.tensor([0, 5, 2])
    return TokenLogProbHead.apply(hidden, weight, None, labels, 1.0, 32, softcap, 1.0, outputs)


def test_fallback_to_trls_head_warns_once_per_reason(monkeypatch):
    calls = []

    class TRLHead:
        @staticmethod
        def apply(*args):  # type: ignore[no-untyped-def]
            calls.append(args)
            return ("trl",)

    monkeypatch.setattr(TokenLogProbHead, "fallback", TRLHead)
    monkeypatch.setattr(TokenLogProbHead, "warned", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _apply(30.0, ("log_probs",)) == ("trl",)
        assert _apply(30.0, ("log_probs",)) == ("trl",)
        assert _apply(None, ("log_probs", "is_top1")) == ("trl",)
        assert _apply(None, ("log_probs", "is_top1")) == ("trl",)
        logps, entropies, *rest = _apply(None, ("log_probs", "entropy"))  # ours: no fallback
    assert len(calls) == 4 and logps.shape == entropies.shape == (3,) and rest == [None] * 3
    messages = [str(w.message) for w in seen]
    assert messages == [
        "gmpo_lm_head: gmpo_core.token_logprobs does not compute a logit soft-cap (30.0); "
        "TRL's LM head scores these tokens",
        "gmpo_lm_head: gmpo_core.token_logprobs does not compute outputs ['is_top1']; "
        "TRL's LM head scores these tokens",
    ]
