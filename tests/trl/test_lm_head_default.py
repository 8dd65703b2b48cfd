"""``gmpo_lm_head``: by default (None) gmpo_core's head scores tokens on the CPU and TRL's on any
other device (a GPU, where ours is slower on paper: docs/lm_head.md); True and False choose one
everywhere. Where gmpo_core's head does not apply, TRL's is used and a warning says so once per
reason."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("trl")

import torch
import trl

from gmpo_trl import GMPOConfig, compat
from gmpo_trl import head_swap as lm_head
from gmpo_trl import trainer as gmpo_trainer
from gmpo_trl.head_swap import TokenLogProbHead, uses_gmpo_head
from tests.trl._support import loss_and_grad, make_inputs, make_trainer

pytestmark = pytest.mark.trl
_NOT_USED = "gmpo_core's LM head (GMPOConfig.gmpo_lm_head) is not used"


def test_default_scores_with_gmpo_core_on_the_cpu(tmp_path, monkeypatch):
    """On a TRL whose chunked head gmpo_core stands in for (1.16), the loss step's scoring pass
    on the CPU runs gmpo_core's head by default; on an older one (1.10: another interface, and
    full logits by default) it warns once, naming the TRL, that TRL's head scored the tokens:
    never a silent no-op."""
    assert GMPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).gmpo_lm_head is None
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
    used_trls = [str(w.message) for w in seen if _NOT_USED in str(w.message)]
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


def test_which_head_per_setting_and_device():
    assert [uses_gmpo_head(None, d) for d in ("cpu", "meta", "cuda", "xpu", "mps")] == [
        True, True, False, False, False,
    ]  # fmt: skip
    assert all(uses_gmpo_head(True, d) for d in ("cpu", "cuda"))
    assert not any(uses_gmpo_head(False, d) for d in ("cpu", "cuda"))


@pytest.mark.parametrize("setting", [None, True, False])
def test_cuda_hidden_states_go_to_trls_head_by_default(monkeypatch, setting):
    """Called with (fake) CUDA hidden states, as on a GPU: by default TRL's head scores them,
    silently (the documented choice, not a fallback); ``gmpo_lm_head=True`` keeps gmpo_core's.
    Before the default was per device, gmpo_core's head scored them whatever the setting."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ours, trls = [], []

    class TRLHead:
        @staticmethod
        def apply(*args):  # type: ignore[no-untyped-def]
            trls.append(args[0].device.type)
            return ("trl",)

    def gmpo_head(hidden, *args, **kwargs):  # type: ignore[no-untyped-def]
        ours.append(hidden.device.type)
        return hidden.sum(-1), None

    monkeypatch.setattr(TokenLogProbHead, "fallback", TRLHead)
    monkeypatch.setattr(TokenLogProbHead, "setting", setting)
    monkeypatch.setattr(TokenLogProbHead, "warned", set())
    monkeypatch.setattr(lm_head, "token_logprobs", gmpo_head)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FakeTensorMode():
            hidden = torch.empty(3, 4, dtype=torch.bfloat16, device="cuda")
            weight = torch.empty(6, 4, dtype=torch.bfloat16, device="cuda")
            labels = torch.zeros(3, dtype=torch.long, device="cuda")
            TokenLogProbHead.apply(hidden, weight, None, labels, 1.0, 32, None, 1.0, ("log_probs",))
        TokenLogProbHead.apply(*_cpu_args())
    expected = {
        None: (["cpu"], ["cuda"]),
        True: (["cuda", "cpu"], []),
        False: ([], ["cuda", "cpu"]),
    }
    assert (ours, trls) == expected[setting]


def _cpu_args():  # type: ignore[no-untyped-def]
    return (torch.randn(3, 4), torch.randn(6, 4), None, torch.tensor([0, 5, 2]), 1.0, 32, None,
            1.0, ("log_probs",))  # fmt: skip


def test_trainer_hands_its_setting_to_the_head(tmp_path, monkeypatch):
    """The trainer's scoring pass swaps the head in with ``gmpo_lm_head`` (None by default) and
    does not swap it at all for False."""
    seen = []
    real = gmpo_trainer.lm_head_swapped

    def spy(backward, setting):  # type: ignore[no-untyped-def]
        seen.append((backward, setting))
        return real(backward, setting)

    monkeypatch.setattr(gmpo_trainer, "lm_head_swapped", spy)
    per_setting = {}
    for setting in (None, True, False):
        seen.clear()
        trainer = make_trainer(tmp_path, gmpo_lm_head=setting)
        loss_and_grad(trainer, make_inputs(trainer, drift=0.5))
        per_setting[setting] = set(seen)
    assert per_setting == {None: {("half", None)}, True: {("half", True)}, False: set()}


def test_a_value_other_than_none_true_false_is_refused(tmp_path):
    with pytest.raises(ValueError, match="gmpo_lm_head='auto': choose None"):
        GMPOConfig(output_dir=str(tmp_path), use_cpu=True, gmpo_lm_head="auto")
