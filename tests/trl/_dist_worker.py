"""One loss step of GMPOTrainer on a fixed, injected batch, under torchrun or alone.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 tests/trl/_dist_worker.py OUT
[MODEL]`` (or plain ``python tests/trl/_dist_worker.py OUT [MODEL]``). Every rank has the same
batch and keeps its contiguous share; the model is wrapped by the trainer's accelerator (DDP under
torchrun), so the gradient read back is the one after DDP's all-reduce. Rank 0 writes
OUT/world<N>.json with the world size, the global loss, the gradient and the logged metrics.

Without MODEL: the tiny model, an 8-row batch that every rank builds alike, the gradient in the
JSON. With MODEL (a local pretrained chat model's directory): that model, a 4-row batch of chat
prompts and sampled completions (``chat_inputs``) that the one-process run builds and saves as
OUT/batch.pt and a two-process run loads; the flat gradient is saved as OUT/grad<N>.pt.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from tests.trl._support import chat_inputs, make_inputs, make_trainer, real_trainer


def main(out: Path, model_dir: str | None = None) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        step(out, Path(tmp), model_dir)


def batch(trainer, out: Path, model_dir: str | None, world: int) -> dict:
    """The whole batch, the same in every rank and run."""
    if model_dir is None:
        return make_inputs(trainer, rows=8, drift=0.8, ref_drift=0.3, empty_row=True)
    path = out / "batch.pt"
    if world > 1:
        return torch.load(path)
    full = chat_inputs(trainer, rows=4, length=12, drift=0.8, ref_drift=0.3)
    torch.save(full, path)
    return full


def step(out: Path, tmp: Path, model_dir: str | None = None) -> None:
    if model_dir is None:
        trainer = make_trainer(tmp, beta=0.05, delta=2.0)
    else:
        trainer = real_trainer(tmp, model_dir, beta=0.05, delta=2.0)
    world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
    full = batch(trainer, out, model_dir, world)
    rows_total = full["advantages"].numel()
    share = rows_total // world
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
            "metrics": {k: v[-1] for k, v in trainer._metrics["train"].items()},
        }
        if model_dir is None:
            record["grad"] = grad.tolist()
        else:
            record["rows"] = rows_total
            record["parameters"] = sum(p.numel() for p in trainer.model.parameters())
            torch.save(grad, out / f"grad{world}.pt")
        (out / f"world{world}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
