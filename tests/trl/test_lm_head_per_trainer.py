"""The LM-head choice belongs to each trainer (each ``lm_head_swapped`` block), not to the
process: two trainers with different ``gmpo_lm_head`` settings in one process (a sweep, a
notebook) each score with their own. It was held in class variables of ``TokenLogProbHead``, so
the last block entered decided for every head, including one still in use."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch
import trl.trainer.utils as trl_utils

from gmpo_trl import compat
from gmpo_trl import head_swap as lm_head
from gmpo_trl.head_swap import lm_head_swapped
from tests.trl._support import loss_and_grad, make_inputs, make_trainer

pytestmark = [
    pytest.mark.trl,
    pytest.mark.skipif(
        compat.chunked_head_unsupported() is not None,
        reason="this TRL's chunked head has another interface: nothing is swapped",
    ),
]


def _score() -> tuple[torch.Tensor | None, ...]:
    """One call of whatever head TRL's patched forward would call now (CPU tensors)."""
    hidden, weight = torch.randn(3, 4), torch.randn(6, 4)
    labels = torch.tensor([0, 5, 2])
    head = trl_utils._ChunkedLogProbFunction
    return head.apply(hidden, weight, None, labels, 1.0, 32, None, 1.0, ("log_probs",))  # type: ignore[no-any-return]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the ``backward_precision`` of each call of gmpo_core's head."""
    seen: list[str] = []
    real = lm_head.token_logprobs

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["backward_precision"])
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_head, "token_logprobs", spy)
    return seen


def test_a_second_trainers_head_does_not_change_the_first(monkeypatch):
    """Trainer A (gmpo_core's head, ``float32`` backward) is scoring when trainer B
    (``gmpo_lm_head=False``: TRL's head; or ``half``) enters and leaves its own block: A's head
    keeps A's settings. Before the fix, A's next call went to TRL's head."""
    seen = _spy(monkeypatch)
    original = trl_utils._ChunkedLogProbFunction
    with lm_head_swapped("float32", True):
        _score()
        with lm_head_swapped("half", False):  # trainer B: TRL's head
            _score()
        _score()  # trainer A again
        with lm_head_swapped("half", True):  # trainer C: gmpo's head, another precision
            _score()
        _score()  # trainer A again
    assert seen == ["float32", "float32", "half", "float32"]
    assert trl_utils._ChunkedLogProbFunction is original


def test_each_block_installs_its_own_head():
    """Two blocks' heads are two objects, each holding its own setting and precision."""
    with lm_head_swapped("float32", True):
        first = trl_utils._ChunkedLogProbFunction
        _score()
        with lm_head_swapped("half", None):
            second = trl_utils._ChunkedLogProbFunction
            _score()
        assert trl_utils._ChunkedLogProbFunction is first
    assert first is not second
    assert (first.setting, first.backward_precision) == (True, "float32")
    assert (second.setting, second.backward_precision) == (None, "half")


def test_two_trainers_in_one_process_keep_their_settings(tmp_path, monkeypatch):
    """Two GMPOTrainers built one after the other with different head settings: each scoring
    pass uses its own trainer's (the first built is not overridden by the second)."""
    seen = _spy(monkeypatch)
    first = make_trainer(tmp_path / "a", gmpo_lm_head=True, gmpo_lm_head_backward="float32")
    second = make_trainer(tmp_path / "b", gmpo_lm_head=None, gmpo_lm_head_backward="half")
    for trainer in (first, second, first):
        seen.clear()
        loss_and_grad(trainer, make_inputs(trainer, drift=0.5))
        assert set(seen) == {trainer.args.gmpo_lm_head_backward}, seen
