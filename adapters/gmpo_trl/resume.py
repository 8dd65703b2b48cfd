"""GMPOTrainer's own part of a checkpoint: one :data:`RESUME_STATE` file per process, written
atomically and restored only when every process can restore its own.

The file holds what GRPOTrainer's files leave out: the micro-batch counter ``_step``, the
accumulation window's entropy sums, the buffered rollouts when the checkpoint falls inside a
generation's buffer, and the number of processes that wrote it. The processes step together
(each generates when its counter says so, and generation gathers across processes), so either
all restore their files or none does: a file that cannot be read, a missing one, or a checkpoint
of another number of processes makes every process resume as GRPOTrainer does (counter at 0,
rollouts regenerated at the next step), each with one warning. One ``gather`` of two numbers
per process decides it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch

#: the part of a GMPOTrainer checkpoint that GRPOTrainer's own files do not hold, one per process
RESUME_STATE = "gmpo_trainer_state_{}.pt"
# what a file must hold, and the types its values may have
FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "generate_every": (int,),
    "steps_per_generation": (int,),
    "entropy_window_stats": (torch.Tensor, type(None)),
    "buffered_inputs": (list, type(None)),
}
# a process's verdict on its own file, gathered from all: [code, step]
NO_FILE, RESTORABLE, NOT_RESTORABLE = 0, 1, 2


def save(folder: str, rank: int, state: dict[str, Any]) -> None:
    """Write ``state`` as ``folder``/:data:`RESUME_STATE` of ``rank``: to a temporary file in the
    same folder, synced, then renamed over the file. A save that fails midway (a kill, a full
    disk) leaves the previous file as it was, or none, never part of one."""
    path = os.path.join(folder, RESUME_STATE.format(rank))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{RESUME_STATE.format(rank)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(folder: str, rank: int, world: int, device: torch.device) -> tuple[Any, str | None]:
    """This process's state from ``folder``: ``(state, None)``, ``(None, None)`` where there is
    no file (a checkpoint of GRPOTrainer, or one of fewer processes than this run's), or
    ``(None, why)`` where there is one that cannot be restored: unreadable (empty, truncated,
    not a state), or written by another number of processes than ``world``."""
    path = os.path.join(folder, RESUME_STATE.format(rank))
    if not os.path.isfile(path):
        return None, None
    # map to the plain CPU: torch has no deserializer for a location "cpu:0"
    location = torch.device("cpu") if device.type == "cpu" else device
    try:
        state = torch.load(path, map_location=location, weights_only=True)
    except Exception as err:  # any unreadable file: empty, garbage, truncated
        detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return None, f"{path} not restored ({detail})"
    if not isinstance(state, dict) or any(
        not isinstance(state.get(k), types) for k, types in FIELDS.items()
    ):
        return None, f"{path} not restored (not a gmpo_trl state: {_describe(state)})"
    saved = state.get("world_size")  # None: a file of an earlier gmpo_trl, which did not say
    if saved is None and os.path.isfile(os.path.join(folder, RESUME_STATE.format(world))):
        saved = f"at least {world + 1}"  # a process of rank `world` wrote one
    if saved is not None and saved != world:
        plural = "" if saved == 1 else "es"
        return None, f"{folder} was saved by {saved} process{plural}, this run has {world}"
    return state, None


def agree(
    state: Any,
    why: str | None,
    rank: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
) -> tuple[bool, str | None]:
    """Whether every process restores its state (all readable, of the same step), and this
    process's warning where some could and some could not (``None`` where all could, or where
    no process has a file: a checkpoint of GRPOTrainer). ``gather``: the processes' ``[code,
    step]`` rows, in rank order (a collective; every process calls it once)."""
    code = (
        NO_FILE if state is None and why is None else RESTORABLE if why is None else NOT_RESTORABLE
    )
    step = state["step"] if state is not None else -1
    mine = torch.tensor([[code, step]], dtype=torch.int64, device=device)
    rows = gather(mine).reshape(-1, 2).tolist()
    codes, steps = [r[0] for r in rows], {r[1] for r in rows}
    if all(c == RESTORABLE for c in codes) and len(steps) == 1:
        return True, None
    if all(c == NO_FILE for c in codes):
        return False, None
    if why is None:
        missing = [r for r, c in enumerate(codes) if c == NO_FILE]
        bad = [r for r, c in enumerate(codes) if c == NOT_RESTORABLE]
        if code == NO_FILE:
            why = f"no {RESUME_STATE.format(rank)} for this process (rank {rank})"
        elif bad:
            why = f"the state of process(es) {_ranks(bad)} cannot be restored"
        elif missing:
            why = f"no state file for process(es) {_ranks(missing)}"
        else:
            why = f"the processes' files are of different steps ({sorted(steps)})"
    return False, (
        f"gmpo_trl: {why}; resuming as GRPOTrainer does, on every process (rollouts "
        "regenerated at the next step)"
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _describe(state: Any) -> str:
    if not isinstance(state, dict):
        return type(state).__name__
    wrong = [k for k, types in FIELDS.items() if not isinstance(state.get(k), types)]
    return "missing or wrong " + ", ".join(wrong)
