"""Two processes (torchrun, gloo) with a fixed batch split B/2 per rank reproduce one process
with B: the loss, the gradient after DDP's all-reduce, and every logged metric.

``accelerate launch --cpu`` starts one process whatever --num_processes says; torchrun starts
two, and the test asserts the world size.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch

pytestmark = pytest.mark.trl

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_dist_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_two_processes_reproduce_one(tmp_path):
    _run([sys.executable, str(WORKER), str(tmp_path)])
    _run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER),
         str(tmp_path)]
    )  # fmt: skip
    one = json.loads((tmp_path / "world1.json").read_text())
    two = json.loads((tmp_path / "world2.json").read_text())
    assert one["world_size"] == 1 and two["world_size"] == 2 and two["backend"] == "gloo"
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
    torch.testing.assert_close(
        torch.tensor(two["grad"]), torch.tensor(one["grad"]), rtol=1e-5, atol=1e-7
    )
    assert one["metrics"].keys() == two["metrics"].keys()
    for key, value in one["metrics"].items():
        assert two["metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert one["metrics"]["clip_ratio/region_mean"] > 0 and one["metrics"]["kl"] > 0
