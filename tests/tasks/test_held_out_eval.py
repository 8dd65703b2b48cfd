"""The held-out evaluation (gmpo_trl.cli.held_out) without a model or a GPU: it samples under its
own seed on the device the model is on, and leaves every generator as it found it, the CPU's and
each accelerator's (a fake CUDA records what is seeded and forked); its "right" share counts the
replies the task's reward scores 1."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

rg = pytest.importorskip("reasoning_gym")
pytest.importorskip("trl")  # gmpo_trl's extra

from gmpo_trl.cli import held_out  # noqa: E402


class FakeCuda:
    """Two CUDA devices' generator states (one integer each), and what was seeded."""

    def __init__(self) -> None:
        self.state = {0: 111, 1: 222}
        self.current = 0
        self.seeded: list[tuple[str, Any]] = []

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        return torch.tensor([self.state[self._index(device)]])

    def set_rng_state(self, state: torch.Tensor, device: Any = "cuda") -> None:
        self.state[self._index(device)] = int(state[0])

    def manual_seed(self, seed: int) -> None:
        self.seeded.append(("manual_seed", self.current))
        self.state[self.current] = seed

    def manual_seed_all(self, seed: int) -> None:
        self.seeded.append(("manual_seed_all", None))
        self.state = {i: seed for i in self.state}

    def current_device(self) -> int:
        return self.current

    @contextlib.contextmanager
    def device(self, index: int) -> Iterator[None]:
        was, self.current = self.current, int(index)
        try:
            yield
        finally:
            self.current = was

    def _index(self, device: Any) -> int:
        if isinstance(device, int):
            return device
        d = torch.device(device)
        return self.current if d.index is None else d.index


class Encoding(dict):
    def to(self, device: Any) -> Encoding:
        return self


class FakeTokenizer:
    padding_side = "right"
    pad_token_id = 0
    eos_token_id = 0

    def apply_chat_template(self, messages: Any, **_: Any) -> str:
        return str(messages[-1]["content"])

    def __call__(self, texts: list[str], **_: Any) -> Encoding:
        return Encoding(input_ids=torch.zeros(len(texts), 3, dtype=torch.long))

    def batch_decode(self, rows: torch.Tensor, **_: Any) -> list[str]:
        return [REPLIES[int(r[0]) % len(REPLIES)] for r in rows]


#: the replies the fake model gives, in turn: right (12.0 is 12), wrong (2.5), right (12)
REPLIES = ["12.0", "2.5", "The answer is 12."]


class FakeModel:
    """A model on ``cuda:1`` whose ``generate`` records the generators' states it samples under."""

    training = True

    def __init__(self, cuda: FakeCuda, device: str = "cuda:1") -> None:
        self.cuda = cuda
        self.device = torch.device(device)
        self.sampled_under: list[tuple[int, int]] = []

    def eval(self) -> None:
        self.training = False

    def train(self, mode: bool = True) -> None:
        self.training = mode

    def generate(self, input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        self.sampled_under.append((torch.initial_seed(), self.cuda.state[1]))
        torch.rand(3)  # sampling draws from the CPU generator too
        rows = torch.arange(len(input_ids)).unsqueeze(1)
        return torch.cat([input_ids, rows], dim=1)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    for name in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all",
                 "current_device", "device"):  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    return fake


def test_the_evaluation_leaves_every_generator_as_it_found_it(cuda: FakeCuda) -> None:
    from gmpo_tasks.catalog import TASKS

    task = TASKS["chat_chain_sum"]
    entries = [{"question": "State the final answer to the following arithmetic problem: 5 + 7 =",
                "answer": "12", "metadata": {}}] * 2  # fmt: skip
    model = FakeModel(cuda)
    torch.manual_seed(7)
    cuda.state = {0: 111, 1: 222}
    cpu_before = torch.get_rng_state()
    out = held_out.held_out_reward(model, FakeTokenizer(), task, max_tokens=4, temperature=1.0,
                                   entries=entries, samples=3)  # fmt: skip
    # sampled under the evaluation's own seed, on the CPU and on the model's device
    assert model.sampled_under == [(held_out.SEED, held_out.SEED)]
    # ... and every generator is as it was: the CPU's and each CUDA device's
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert cuda.state == {0: 111, 1: 222}, cuda.seeded
    assert model.training and cuda.current == 0
    # the "right" share counts the replies scored 1: "12.0" and "... 12." for 12, not "2.5"
    scores = task.reward(None, REPLIES, entry=[json.dumps(entries[0])] * 3)
    assert scores[0] == scores[2] == 1.0 > scores[1]
    assert out["right"] == pytest.approx(4 / 6)
    assert out["reward"] == pytest.approx((4 + 2 * scores[1]) / 6)


def test_on_the_cpu_no_accelerator_is_seeded(cuda: FakeCuda) -> None:
    from gmpo_tasks.catalog import TASKS

    entries = [{"question": "1 + 1 =", "answer": "2", "metadata": {}}]
    model = FakeModel(cuda, device="cpu")
    cpu_before = torch.get_rng_state()
    held_out.held_out_reward(model, FakeTokenizer(), TASKS["chat_chain_sum"], max_tokens=4,
                             temperature=1.0, entries=entries, samples=2)  # fmt: skip
    assert model.sampled_under[0][0] == held_out.SEED
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert cuda.seeded == [] and cuda.state == {0: 111, 1: 222}
