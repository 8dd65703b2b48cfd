"""Resuming a GMPOTrainer state under torchrun, from two checkpoints written as by a run.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 tests/trl/_resume_worker.py OUT``.
Rank 0 writes OUT/one/gmpo_trainer_state_0.pt as a one-process run would (counter 3 of a
generation of 4 micro-batches, its buffer), and each rank r writes OUT/two/gmpo_trainer_state_r.pt
as a two-process run would; then every rank resumes from each folder
(``_load_optimizer_and_scheduler``) and writes OUT/rank<r>.json: the world size, the backend, the
accelerator's device and, per folder, its counter, whether it holds buffered rollouts and the
gmpo_trl warnings it gave.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.trl._support import make_trainer


def state(trainer: Any, world_size: int) -> dict[str, Any]:
    every = trainer.args.steps_per_generation * trainer.num_iterations
    return {
        "step": 3, "generate_every": every,
        "steps_per_generation": trainer.args.steps_per_generation, "entropy_window_stats": None,
        "buffered_inputs": [{"advantages": torch.arange(4.0)}] * 2, "world_size": world_size,
    }  # fmt: skip


def main(out: Path) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(
            Path(tmp), per_device_train_batch_size=16, num_iterations=2, steps_per_generation=2
        )
        rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
        for name in ("one", "two"):
            (out / name).mkdir(exist_ok=True)
        if rank == 0:
            torch.save(state(trainer, 1), out / "one" / "gmpo_trainer_state_0.pt")
        torch.save(state(trainer, world), out / "two" / f"gmpo_trainer_state_{rank}.pt")
        dist.barrier()
        record: dict[str, Any] = {
            "world_size": world,
            "backend": dist.get_backend(),
            "device": str(trainer.accelerator.device),
        }
        for name in ("one", "two"):
            trainer._step, trainer._buffered_inputs = 0, None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer._load_optimizer_and_scheduler(str(out / name))
            record[name] = {
                "step": trainer._step,
                "buffered": trainer._buffered_inputs is not None,
                "warnings": [str(w.message) for w in caught if "gmpo_trl" in str(w.message)],
            }
        (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
