"""``gmpo_lm_head``: by default (None) gmpo_core's torch backend scores tokens on the CPU, its
fused Triton backend on CUDA where Triton imports, and TRL's head on any other device (and on
CUDA without Triton); True and False choose gmpo_core's or TRL's everywhere. Where gmpo_core's
head does not apply, TRL's is used and a warning says so once per reason."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

pytest.importorskip("trl")

import torch
import trl

from gmpo_trl import GMPOConfig, compat, head_swap
from gmpo_trl import trainer as gmpo_trainer
from gmpo_trl.head_swap import TokenLogProbHead, head_for, uses_gmpo_head
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
    original = head_swap.token_logprobs

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs.get("compute_entropy"))
        return original(*args, **kwargs)

    trainer = make_trainer(tmp_path)  # no gmpo_lm_head given
    inputs = make_inputs(trainer, drift=0.5)
    monkeypatch.setattr(head_swap, "token_logprobs", counting)
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


def _apply(head, softcap, outputs):  # type: ignore[no-untyped-def]
    hidden, weight = torch.randn(3, 4), torch.randn(6, 4)
    labels = torch.tensor([0, 5, 2])
    return head.apply(hidden, weight, None, labels, 1.0, 32, softcap, 1.0, outputs)


def test_fallback_to_trls_head_warns_once_per_reason(monkeypatch):
    calls = []

    class TRLHead:
        @staticmethod
        def apply(*args):  # type: ignore[no-untyped-def]
            calls.append(args)
            return ("trl",)

    head = TokenLogProbHead(TRLHead, setting=True)
    monkeypatch.setattr(TokenLogProbHead, "warned", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _apply(head, 30.0, ("log_probs",)) == ("trl",)
        assert _apply(head, 30.0, ("log_probs",)) == ("trl",)
        assert _apply(head, None, ("log_probs", "is_top1")) == ("trl",)
        assert _apply(head, None, ("log_probs", "is_top1")) == ("trl",)
        logps, entropies, *rest = _apply(head, None, ("log_probs", "entropy"))  # ours
    assert len(calls) == 4 and logps.shape == entropies.shape == (3,) and rest == [None] * 3
    messages = [str(w.message) for w in seen]
    assert messages == [
        "gmpo_lm_head: gmpo_core.token_logprobs does not compute a logit soft-cap (30.0); "
        "TRL's LM head scores these tokens",
        "gmpo_lm_head: gmpo_core.token_logprobs does not compute outputs ['is_top1']; "
        "TRL's LM head scores these tokens",
    ]


_DEVICES = ("cpu", "meta", "cuda", "xpu", "mps")


def test_which_head_per_setting_device_and_triton():
    """None: torch backend on the CPU, fused on CUDA with Triton, TRL's elsewhere; True:
    gmpo_core's everywhere (fused on CUDA with Triton); False: TRL's everywhere."""
    assert [head_for(None, d, fused=True) for d in _DEVICES] == [
        "torch", "torch", "triton", None, None,
    ]  # fmt: skip
    assert [head_for(None, d, fused=False) for d in _DEVICES] == [
        "torch", "torch", None, None, None,
    ]  # fmt: skip
    assert [head_for(True, d, fused=True) for d in _DEVICES] == [
        "torch", "torch", "triton", "torch", "torch",
    ]  # fmt: skip
    assert [head_for(True, d, fused=False) for d in _DEVICES] == ["torch"] * 5
    assert [head_for(False, d, fused=f) for d in _DEVICES for f in (True, False)] == [None] * 10
    assert uses_gmpo_head(None, "cuda", fused=True) and not uses_gmpo_head(None, "cuda", False)
    assert head_swap.triton_importable() == (importlib.util.find_spec("triton") is not None)


@pytest.mark.parametrize("fused", [True, False], ids=["triton", "no-triton"])
@pytest.mark.parametrize("setting", [None, True, False])
def test_cuda_hidden_states_per_setting(monkeypatch, setting, fused):
    """Called with (fake) CUDA hidden states, as on a GPU: by default gmpo_core's fused head
    scores them where Triton imports, TRL's head where it does not (the documented choice, not
    a fallback: silent); ``True`` keeps gmpo_core's, ``False`` TRL's. The CPU call after it:
    gmpo_core's torch backend unless False."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ours, trls = [], []

    class TRLHead:
        @staticmethod
        def apply(*args):  # type: ignore[no-untyped-def]
            trls.append(args[0].device.type)
            return ("trl",)

    def gmpo_head(hidden, *args, **kwargs):  # type: ignore[no-untyped-def]
        ours.append((hidden.device.type, kwargs["backend"]))
        return hidden.sum(-1), None

    monkeypatch.setattr(head_swap, "triton_importable", lambda: fused)
    monkeypatch.setattr(TokenLogProbHead, "warned", set())
    monkeypatch.setattr(head_swap, "token_logprobs", gmpo_head)
    head = TokenLogProbHead(TRLHead, setting=setting)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FakeTensorMode():
            hidden = torch.empty(3, 4, dtype=torch.bfloat16, device="cuda")
            weight = torch.empty(6, 4, dtype=torch.bfloat16, device="cuda")
            labels = torch.zeros(3, dtype=torch.long, device="cuda")
            head.apply(hidden, weight, None, labels, 1.0, 32, None, 1.0, ("log_probs",))
        head.apply(*_cpu_args())
    cuda_ours = [("cuda", "triton" if fused else "torch")]
    expected = {
        None: ([*cuda_ours, ("cpu", "torch")], []) if fused else ([("cpu", "torch")], ["cuda"]),
        True: ([*cuda_ours, ("cpu", "torch")], []),
        False: ([], ["cuda", "cpu"]),
    }
    assert (ours, trls) == expected[setting]


def test_a_forced_backend_and_float64(monkeypatch):
    """``GMPOTrainer.gmpo_lm_head_backend`` forces a backend; float64 inputs (which the fused
    kernels refuse) go to the torch backend."""
    seen = []

    def gmpo_head(hidden, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["backend"])
        return hidden.sum(-1), None

    monkeypatch.setattr(head_swap, "token_logprobs", gmpo_head)
    monkeypatch.setattr(head_swap, "triton_importable", lambda: True)
    TokenLogProbHead(None, setting=True, backend="triton").apply(*_cpu_args())
    h, w, *rest = _cpu_args()
    TokenLogProbHead(None, setting=True, backend="triton").apply(h.double(), w.double(), *rest)
    assert seen == ["triton", "torch"]


def _cpu_args():  # type: ignore[no-untyped-def]
    return (torch.randn(3, 4), torch.randn(6, 4), None, torch.tensor([0, 5, 2]), 1.0, 32, None,
            1.0, ("log_probs",))  # fmt: skip


def test_trainer_hands_its_setting_to_the_head(tmp_path, monkeypatch):
    """The trainer's scoring pass swaps the head in with ``gmpo_lm_head`` (None by default) and
    does not swap it at all for False."""
    seen = []
    real = gmpo_trainer.lm_head_swapped

    def spy(backward, setting, backend=None):  # type: ignore[no-untyped-def]
        seen.append((backward, setting))
        return real(backward, setting, backend)

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
