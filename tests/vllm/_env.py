"""The environment of a test's subprocess that runs as a fresh command would: this checkout on
PYTHONPATH, and none of the variables that a vLLM engine built earlier in the test session left
in ``os.environ`` (TRL's colocate mode sets the torch.distributed ones, with which accelerate
takes a new process for a multi-CPU run and warns about OMP_NUM_THREADS)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: set for a vLLM engine in colocate mode; a command started by hand has none of them
DISTRIBUTED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT")  # fmt: skip


def fresh_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")])
    return env
