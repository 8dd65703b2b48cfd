"""``gmpo_trainer_state_<rank>.pt``, GMPOTrainer's own part of a checkpoint (CHANGELOG,
Unreleased, "Resume"): a file that cannot be read, and a checkpoint of another number of
processes, resume as GRPOTrainer does, alike on every process, with one warning; the file is
written atomically.

The loads run ``GMPOTrainer._load_optimizer_and_scheduler`` on a folder that holds only the
state files (GRPOTrainer's part then loads nothing), so that each case takes a tiny trainer and
no training. Two processes are simulated by two trainers in two threads, each with an
accelerator stand-in whose ``gather`` exchanges the tensors of both, as a collective does;
``test_two_processes_agree_under_torchrun`` runs the real thing (torchrun, gloo).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")

import torch

import gmpo_trl.trainer
from tests.trl._support import GRPOTrainer, make_trainer

pytestmark = pytest.mark.trl

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_resume_worker.py")
LAYOUT = dict(per_device_train_batch_size=16, num_iterations=2, steps_per_generation=2)
STEP = 3  # inside a generation's buffer (generate every 4 micro-batches)


def state(trainer: Any, world_size: int | None = 1, step: int = STEP) -> dict[str, Any]:
    """A state as GMPOTrainer writes it for ``trainer``'s layout, inside a generation's buffer;
    ``world_size`` None: as gmpo_trl wrote it before the number of processes was recorded."""
    every = trainer.args.steps_per_generation * trainer.num_iterations
    saved: dict[str, Any] = {
        "step": step,
        "generate_every": every,
        "steps_per_generation": trainer.args.steps_per_generation,
        "entropy_window_stats": None,
        "buffered_inputs": [{"advantages": torch.arange(4.0) + i} for i in range(2)],
    }
    if world_size is not None:
        saved["world_size"] = world_size
    return saved


def load(trainer: Any, folder: Path) -> list[str]:
    """``trainer`` resumes from ``folder``; the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer._load_optimizer_and_scheduler(str(folder))
    return [str(w.message) for w in caught if "gmpo_trl" in str(w.message)]


def resumed_as_grpo(trainer: Any) -> bool:
    """GRPOTrainer's state on resuming: the counter at 0, no buffered rollouts (it generates at
    the next step)."""
    return trainer._step == 0 and trainer._buffered_inputs is None


@pytest.fixture(scope="module")
def trainers(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """Two tiny trainers of the same layout (built once; each test resets what it changes)."""
    return [
        make_trainer(tmp_path_factory.mktemp(f"rank{r}"), **LAYOUT, save_strategy="no")
        for r in range(2)
    ]


@pytest.fixture
def trainer(trainers: list[Any]) -> Any:
    t = trainers[0]
    t._step, t._buffered_inputs, t._entropy_window_stats = 0, None, None
    return t


# -- a file that cannot be read -----------------------------------------------------------------


def test_a_readable_state_is_restored(tmp_path: Path, trainer: Any) -> None:
    """The reference for the cases below: a good file restores the counter and the buffer."""
    torch.save(state(trainer), tmp_path / "gmpo_trainer_state_0.pt")
    assert load(trainer, tmp_path) == []
    assert trainer._step == STEP
    assert torch.equal(trainer._buffered_inputs[1]["advantages"], torch.arange(4.0) + 1)


def _truncated(trainer: Any, tmp_path: Path) -> bytes:
    torch.save(state(trainer), tmp_path / "whole.pt")
    data = (tmp_path / "whole.pt").read_bytes()
    return data[: len(data) // 2]


CONTENTS = {
    "empty": lambda trainer, tmp_path: b"",  # a kill during the save, a full disk
    "garbage": lambda trainer, tmp_path: b"eeek, not a checkpoint" * 5,
    "truncated": _truncated,
    "not a state": lambda trainer, tmp_path: _saved({"step": "three"}, tmp_path),
}


def _saved(obj: Any, tmp_path: Path) -> bytes:
    torch.save(obj, tmp_path / "other.pt")
    return (tmp_path / "other.pt").read_bytes()


# Regression (CHANGELOG, Unreleased): an empty file raised EOFError, other bytes KeyError: '101'.
@pytest.mark.parametrize("content", list(CONTENTS))
def test_an_unreadable_state_resumes_as_grpo_with_one_warning(
    tmp_path: Path, trainer: Any, content: str
) -> None:
    path = tmp_path / "gmpo_trainer_state_0.pt"
    path.write_bytes(CONTENTS[content](trainer, tmp_path))
    messages = load(trainer, tmp_path)
    assert len(messages) == 1, messages
    assert str(path) in messages[0] and "resuming as GRPOTrainer does" in messages[0]
    assert resumed_as_grpo(trainer)


class _Killed(OSError):
    pass


def _dies_midway(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    """``torch.save`` that writes some bytes, then fails (a kill, a full disk)."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as out:
            out.write(b"PK\x03\x04 half a zip")
    else:
        f.write(b"PK\x03\x04 half a zip")
    raise _Killed(28, "No space left on device")


# Regression (CHANGELOG, Unreleased): the file was written in place, so a failure midway left a
# partial file where the previous one was.
def test_a_save_that_fails_midway_leaves_the_previous_file(
    tmp_path: Path, trainer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    path = folder / "gmpo_trainer_state_0.pt"
    torch.save(state(trainer), path)
    before = path.read_bytes()
    monkeypatch.setattr(type(trainer), "_get_output_dir", lambda self, trial: str(tmp_path))
    monkeypatch.setattr(GRPOTrainer, "_save_checkpoint", lambda *a, **k: None)  # its own files
    monkeypatch.setattr(torch, "save", _dies_midway)
    trainer.state.global_step = 7
    with pytest.raises(_Killed):
        trainer._save_checkpoint(trainer.model, None)
    assert path.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["gmpo_trainer_state_0.pt"]  # no temp left


def test_a_save_writes_the_world_size(
    tmp_path: Path, trainer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(trainer), "_get_output_dir", lambda self, trial: str(tmp_path))
    monkeypatch.setattr(GRPOTrainer, "_save_checkpoint", lambda *a, **k: None)  # its own files
    trainer.state.global_step, trainer._step = 5, 3
    trainer._save_checkpoint(trainer.model, None)
    folder = tmp_path / "checkpoint-5"
    assert sorted(p.name for p in folder.iterdir()) == ["gmpo_trainer_state_0.pt"]
    saved = torch.load(folder / "gmpo_trainer_state_0.pt", weights_only=True)
    assert saved["world_size"] == 1 and saved["step"] == 3


# -- another number of processes ----------------------------------------------------------------


class _Group:
    """What a collective does for ``gather``, between threads: every rank gets every rank's
    tensor, in rank order."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * world

    def stand_in(self, rank: int) -> SimpleNamespace:
        def gather(t: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = t
            self.barrier.wait()
            out = torch.cat([s for s in self.slots if s is not None])
            self.barrier.wait()
            return out

        world = len(self.slots)
        return SimpleNamespace(
            process_index=rank, num_processes=world, device=torch.device("cpu"), gather=gather,
        )  # fmt: skip


def load_as_ranks(
    trainers: list[Any], folder: Path, monkeypatch: pytest.MonkeyPatch
) -> list[list[str]]:
    """Each trainer resumes from ``folder`` as rank r of len(trainers) processes, all at once;
    the warnings each gave (recorded per thread: ``warnings.catch_warnings`` is one state for
    the whole process)."""
    group = _Group(len(trainers))
    given: dict[int, list[str]] = {}
    messages: list[list[str]] = [[] for _ in trainers]
    errors: list[BaseException] = []

    def warn(message: Any, *args: Any, **kwargs: Any) -> None:
        given.setdefault(threading.get_ident(), []).append(str(message))

    def run(r: int) -> None:
        try:
            trainers[r]._load_optimizer_and_scheduler(str(folder))
            messages[r] = given.get(threading.get_ident(), [])
        except BaseException as e:  # reported below
            errors.append(e)

    monkeypatch.setattr(gmpo_trl.trainer, "warnings", SimpleNamespace(warn=warn))
    for r, t in enumerate(trainers):
        monkeypatch.setattr(t, "accelerator", group.stand_in(r))
        t._step, t._buffered_inputs, t._entropy_window_stats = 0, None, None
    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(trainers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    return messages


# Regression (CHANGELOG, Unreleased): resumed by two processes from a one-process checkpoint, rank 0
# restored its counter and buffer while rank 1 (no gmpo_trainer_state_1.pt) started at 0: rank 0
# trained while rank 1 generated.
def test_a_rank_without_its_file_makes_every_rank_drop_the_state(
    tmp_path: Path, trainers: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.save(state(trainers[0], world_size=1), tmp_path / "gmpo_trainer_state_0.pt")
    messages = load_as_ranks(trainers, tmp_path, monkeypatch)
    assert [t._step for t in trainers] == [0, 0]
    assert all(resumed_as_grpo(t) for t in trainers)
    assert [len(m) for m in messages] == [1, 1], messages
    assert "saved by 1 process" in messages[0][0]
    assert "gmpo_trainer_state_1.pt" in messages[1][0]


def test_an_old_checkpoint_without_rank_1s_file_is_dropped_too(
    tmp_path: Path, trainers: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of an earlier gmpo_trl (no world size recorded): the missing file alone tells."""
    torch.save(state(trainers[0], world_size=None), tmp_path / "gmpo_trainer_state_0.pt")
    messages = load_as_ranks(trainers, tmp_path, monkeypatch)
    assert all(resumed_as_grpo(t) for t in trainers)
    assert [len(m) for m in messages] == [1, 1], messages


def test_an_unreadable_file_on_one_rank_makes_every_rank_drop_the_state(
    tmp_path: Path, trainers: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for r in range(2):
        torch.save(state(trainers[r], world_size=2), tmp_path / f"gmpo_trainer_state_{r}.pt")
    (tmp_path / "gmpo_trainer_state_1.pt").write_bytes(b"")
    messages = load_as_ranks(trainers, tmp_path, monkeypatch)
    assert all(resumed_as_grpo(t) for t in trainers)
    assert [len(m) for m in messages] == [1, 1], messages


def test_two_ranks_with_their_files_restore_them(
    tmp_path: Path, trainers: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for r in range(2):
        torch.save(state(trainers[r], world_size=2), tmp_path / f"gmpo_trainer_state_{r}.pt")
    assert load_as_ranks(trainers, tmp_path, monkeypatch) == [[], []]
    assert [t._step for t in trainers] == [STEP, STEP]
    assert all(t._buffered_inputs is not None for t in trainers)


def test_a_checkpoint_of_grpo_trainer_resumes_silently(
    tmp_path: Path, trainers: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_as_ranks(trainers, tmp_path, monkeypatch) == [[], []]
    assert all(resumed_as_grpo(t) for t in trainers)


# Regression (CHANGELOG, Unreleased): a one-process run restored rank 0's share of a two-process
# checkpoint's buffer as if it were the whole.
@pytest.mark.parametrize("recorded", [True, False])
def test_fewer_processes_than_saved_drop_the_state(
    tmp_path: Path, trainer: Any, recorded: bool
) -> None:
    """Saved by two processes, resumed by one: with the world size recorded, or (a file of an
    earlier gmpo_trl) told by rank 1's file beside rank 0's."""
    for r in range(2):
        saved = state(trainer, world_size=2 if recorded else None)
        torch.save(saved, tmp_path / f"gmpo_trainer_state_{r}.pt")
    messages = load(trainer, tmp_path)
    assert len(messages) == 1, messages
    assert "2 processes" in messages[0] and "this run has 1" in messages[0]
    assert resumed_as_grpo(trainer)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_processes_agree_under_torchrun(tmp_path: Path) -> None:
    """Two processes (torchrun, gloo): from a one-process checkpoint inside a buffer both drop
    the state alike, each with one warning; from a two-process one both restore theirs."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'adapters'}",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER),
           str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2] and ranks[0]["backend"] == "gloo"
    one = [r["one"] for r in ranks]
    assert [(r["step"], r["buffered"]) for r in one] == [(0, False), (0, False)], ranks
    assert [len(r["warnings"]) for r in one] == [1, 1], ranks
    two = [r["two"] for r in ranks]
    assert [(r["step"], r["buffered"], r["warnings"]) for r in two] == [(STEP, True, [])] * 2, ranks
