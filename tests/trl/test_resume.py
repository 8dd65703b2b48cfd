"""Resuming ``GMPOTrainer`` from a checkpoint (CHANGELOG, 0.2): 4 steps straight and 2 steps,
saved, then 2 more resumed from ``checkpoint-2`` give the same logged row at every step and the
same final weights, with the adaptive entropy controller on (its coefficient changes every step,
and the bonus of a step reads it).

Everything runs on the CPU in float32 with a seeded tiny model and seeded data; the resumed run
reads the checkpoint's weights, optimizer state and RNG states, so the comparison is exact: the
same operations on the same bits give the same bits (no tolerance is needed, and a lost piece of
state shows up as a difference at step 3). Timing metrics (``step_time``) are left out.

Layouts: ``boundary`` puts checkpoint-2 at the end of a generation's buffer (generate every 2
steps), which GRPOTrainer alone resumes exactly; ``mid-buffer`` (generate every 4 steps) and
``accumulation-mid-buffer`` (2 micro-batches per step, generate every 8 micro-batches) put it
inside one: there GRPOTrainer alone regenerates at step 3 from new samples (its ``_step`` counter
and buffered rollouts are not in its checkpoints), and GMPOTrainer's own checkpoint file restores
them.
"""

from __future__ import annotations

import math
import shutil
import warnings

import pytest

pytest.importorskip("trl")

import torch

from tests.trl._support import make_trainer

pytestmark = pytest.mark.trl

CONFIG = dict(
    max_completion_length=3, max_steps=4, save_strategy="steps", save_steps=2,
    use_adaptive_entropy=True, entropy_target=3.2, entropy_coef_delta=0.01,
)  # fmt: skip
LAYOUTS = {
    "boundary": dict(per_device_train_batch_size=32, num_iterations=2, steps_per_generation=1),
    "mid-buffer": dict(per_device_train_batch_size=32, num_iterations=2, steps_per_generation=2),
    "accumulation-mid-buffer": dict(
        per_device_train_batch_size=16, gradient_accumulation_steps=2, num_iterations=2,
        steps_per_generation=4,
    ),
}  # fmt: skip
TIMING = {"step_time"}


def spread_reward(prompts: list[str], completions: list[str], **_) -> list[float]:
    """A dense reward (varies with the first character), so that every group has an advantage."""
    return [(ord(c[:1] or " ") % 7) / 6 for c in completions]


def step_rows(trainer) -> list[dict]:
    """The logged row of each optimizer step (not the end-of-training summary), timing left out;
    NaN as a string, so that rows compare with ==."""
    rows = [h for h in trainer.state.log_history if "loss" in h]
    return [
        {k: "nan" if isinstance(v, float) and math.isnan(v) else v
         for k, v in row.items() if k not in TIMING}
        for row in rows
    ]  # fmt: skip


def weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The 4-step run of each layout (trained once per module): its rows, weights, checkpoint."""
    runs = {}

    def get(layout: str):
        if layout not in runs:
            out = tmp_path_factory.mktemp(f"straight-{layout}")
            trainer = make_trainer(out, reward=spread_reward, **CONFIG, **LAYOUTS[layout])
            before = weights(trainer)
            trainer.train()
            after = weights(trainer)
            assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
            runs[layout] = (step_rows(trainer), after, out / "checkpoint-2")
        return runs[layout]

    return get


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resumed_run_equals_the_straight_run(tmp_path, straight, layout):
    rows, final, checkpoint = straight(layout)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    coefs = [r["entropy_coef"] for r in rows]
    assert len(set(coefs)) == 4, coefs  # the controller moves at every step
    resumed = make_trainer(tmp_path, reward=spread_reward, **CONFIG, **LAYOUTS[layout])
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4
    got = step_rows(resumed)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for want_row, got_row in zip(rows, got, strict=True):
        diff = {k: (want_row.get(k), got_row.get(k)) for k in sorted({*want_row, *got_row})
                if want_row.get(k) != got_row.get(k)}  # fmt: skip
        assert not diff, f"step {want_row['step']}: {diff}"
    now = weights(resumed)
    assert now.keys() == final.keys()
    for name in final:
        assert torch.equal(final[name], now[name]), name


def test_the_controller_state_matters_to_the_comparison(tmp_path, straight):
    """Resumed from a copy of checkpoint-2 without the entropy controller's state file
    (GRPOTrainer's ``entropy_ctrl_state.json``), step 3 differs: the comparison above sees a lost
    controller state."""
    rows, _, checkpoint = straight("boundary")
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint, copy)
    (copy / "entropy_ctrl_state.json").unlink()
    resumed = make_trainer(tmp_path / "out", reward=spread_reward, **CONFIG, **LAYOUTS["boundary"])
    resumed.train(resume_from_checkpoint=str(copy))
    got = step_rows(resumed)
    assert got[2]["entropy_coef"] != rows[2]["entropy_coef"]
    assert got[2]["loss"] != rows[2]["loss"]


# Regression (CHANGELOG, Unreleased): an empty gmpo_trainer_state_0.pt (a kill during its save,
# a full disk) raised EOFError on resuming, other bytes an error of the unpickler.
@pytest.mark.parametrize("content", [b"", b"eeek, not a checkpoint" * 5], ids=["empty", "garbage"])
def test_an_unreadable_state_file_resumes_as_grpo_trainer(tmp_path, straight, content):
    """checkpoint-2 inside a buffer with its state file unreadable: steps 3-4 train as from
    the same checkpoint without the file (GRPOTrainer's resume: rollouts regenerated at step
    3), with one warning."""
    _, _, checkpoint = straight("mid-buffer")
    runs = {}
    for case in ("without", "unreadable"):
        copy = tmp_path / case / "checkpoint-2"
        shutil.copytree(checkpoint, copy)
        state = copy / "gmpo_trainer_state_0.pt"
        if case == "without":
            state.unlink()
        else:
            state.write_bytes(content)
        resumed = make_trainer(
            tmp_path / case / "out", reward=spread_reward, **CONFIG, **LAYOUTS["mid-buffer"]
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed.train(resume_from_checkpoint=str(copy))
        given = [str(w.message) for w in caught if "gmpo_trl" in str(w.message)]
        runs[case] = (step_rows(resumed), weights(resumed), given)
    assert runs["without"][2] == []
    assert len(runs["unreadable"][2]) == 1, runs["unreadable"][2]
    assert [r["step"] for r in runs["unreadable"][0]] == [1, 2, 3, 4]
    assert runs["unreadable"][0] == runs["without"][0]
    for name, value in runs["without"][1].items():
        assert torch.equal(runs["unreadable"][1][name], value), name
