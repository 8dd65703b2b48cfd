"""One loss step of GMPOTrainer on a fixed, injected batch, under torchrun or alone.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 tests/trl/_dist_worker.py OUT`` (or
plain ``python tests/trl/_dist_worker.py OUT``). Every rank builds the same 8-row batch and keeps
its contiguous share; the model is wrapped by the trainer's accelerator (DDP under torchrun), so
the gradient read back is the one after DDP's all-reduce. Rank 0 writes OUT/world<N>.json with
the world size, the global loss, the gradient and the logged metrics.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from tests.trl._support import make_inputs, make_trainer


def main(out: Path) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        step(out, Path(tmp))


def step(out: Path, tmp: Path) -> None:
    trainer = make_trainer(tmp, beta=0.05, delta=2.0)
    world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
    full = make_inputs(trainer, rows=8, drift=0.8, ref_drift=0.3, empty_row=True)
    share = 8 // world
    rows = slice(rank * share, (rank + 1) * share)
    inputs = {k: v[rows] for k, v in full.items()}
    model = trainer.accelerator.prepare_model(trainer.model)
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(model, inputs)
    trainer.accelerator.backward(loss)
    total = loss.detach().clone()
    if world > 1:
        dist.all_reduce(total)
        total /= world
    grad = torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters() if p.grad is not None])
    if trainer.accelerator.is_main_process:
        record = {
            "world_size": world,
            "backend": dist.get_backend() if world > 1 else None,
            "loss": float(total),
            "grad": grad.tolist(),
            "metrics": {k: v[-1] for k, v in trainer._metrics["train"].items()},
        }
        (out / f"world{world}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
