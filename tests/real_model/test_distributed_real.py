"""Two processes (torchrun, gloo, CPU) on the real model (SmolLM2-135M-Instruct, float32) with a
fixed 4-row batch split 2 rows per rank reproduce one process with all 4 rows: the loss, the
whole gradient after DDP's all-reduce (134,515,008 numbers, saved with torch.save) and every
logged metric. The worker is tests/trl/_dist_worker.py with the model's directory."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")

import torch

from tests.trl._support import grad_errors
from tests.trl.test_distributed import WORKER, _free_port, _run

pytestmark = pytest.mark.trl

# Tolerances. The same float32 model and rows; what differs is how the sums are split: each
# rank's matrix products see 2 rows instead of 4 (a weight gradient sums 2 rows' tokens, then
# gloo adds the two ranks' halves and DDP divides by 2), and the loss is the mean of two
# means. Measured: the losses agree to 8 digits, gradient relative L2 error 1.5e-7, largest
# element difference 9.1e-8 of the largest element; the bounds are over ten times that, and far
# below what a lost or doubled rank would give (an error of 0.5 or more).
LOSS_RTOL = 1e-6
GRAD_REL_L2 = 2e-6  # ||g2 - g1|| / ||g1||
GRAD_REL_MAX = 2e-6  # max |g2 - g1| / max |g1|, over all 134,515,008 elements


def test_two_processes_reproduce_one_on_the_real_model(smollm2, tmp_path):
    _run([sys.executable, str(WORKER), str(tmp_path), smollm2])  # builds OUT/batch.pt
    _run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER),
         str(tmp_path), smollm2]
    )  # fmt: skip
    one = json.loads((tmp_path / "world1.json").read_text())
    two = json.loads((tmp_path / "world2.json").read_text())
    assert one["world_size"] == 1 and two["world_size"] == 2 and two["backend"] == "gloo"
    assert one["rows"] == two["rows"] == 4
    assert one["parameters"] == two["parameters"] == 134_515_008
    g1 = torch.load(tmp_path / "grad1.pt")
    g2 = torch.load(tmp_path / "grad2.pt")
    assert g1.numel() == g2.numel() == 134_515_008  # every parameter has its gradient
    assert g1.abs().max() > 0
    rel_l2, rel_max = grad_errors(g2, g1)
    print(f"loss {one['loss']:.8f} / two processes {two['loss']:.8f}, gradient relative L2 "
          f"error {rel_l2:.2e}, largest element difference {rel_max:.2e}")  # fmt: skip
    assert two["loss"] == pytest.approx(one["loss"], rel=LOSS_RTOL)
    assert rel_l2 < GRAD_REL_L2 and rel_max < GRAD_REL_MAX, (rel_l2, rel_max)

    assert one["metrics"].keys() == two["metrics"].keys()
    for key, value in one["metrics"].items():
        assert two["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
    assert one["metrics"]["clip_ratio/region_mean"] > 0 and one["metrics"]["kl"] > 0
