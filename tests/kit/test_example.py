"""docs/contributing.md's example host adapter runs: on one process its loss and metrics are
gmpo_core's; on two (``torch.distributed``, gloo) each half of a batch gets the metrics of the
whole batch. And it is as short as the page says (blank lines aside)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gmpo_core import gmpo_loss

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "contributing.md"
SECTION = "## A new host adapter"
CONFIG = SimpleNamespace(clip_low=0.2, clip_high=0.3, kl_coef=0.1)


def _example_source() -> str:
    text = PAGE.read_text().split(SECTION, 1)[1]
    block = re.search(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert block is not None, f"no python block under {SECTION!r}"
    return block.group(1)


def _example() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "gmpo_myhost"}
    exec(compile(_example_source(), str(PAGE), "exec"), namespace)
    return namespace


def _batch(rows: slice = slice(None)) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    b, t = 6, 5
    logp = torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).long()
    batch = {
        "logp": logp,
        "old_logp": logp + 0.4 * torch.randn(b, t, generator=g),
        "advantages": torch.randn(b, 1, generator=g).expand(b, t).clone(),  # per token
        "mask": mask,
        "ref_logp": logp + 0.2 * torch.randn(b, t, generator=g),
    }
    return {k: v[rows] for k, v in batch.items()}


def test_the_example_is_about_25_lines_of_code() -> None:
    lines = [line for line in _example_source().splitlines() if line.strip()]
    assert 20 <= len(lines) <= 25, len(lines)


def test_the_example_on_one_process_is_the_core() -> None:
    assert not dist.is_initialized()
    batch = _batch()
    loss, metrics = _example()["policy_loss"](**batch, config=CONFIG)
    valid = batch["mask"].bool()
    want = gmpo_loss(
        batch["logp"], batch["old_logp"], batch["advantages"][:, 0], valid, epsilon=0.2,
        epsilon_high=0.3, beta=0.1, ref_logp=batch["ref_logp"],
    )  # fmt: skip
    torch.testing.assert_close(loss, want.loss)
    expected = {f"myhost/{k}": v.item() for k, v in want.metrics.items() if k != "kl"}
    assert metrics.keys() == expected.keys()
    assert metrics == pytest.approx(expected, rel=1e-6, nan_ok=True)
    assert metrics["myhost/clip_ratio/region_mean"] > 0  # the clip acts: the test can fail


def test_the_example_refuses_a_bad_clip_under_the_host_names() -> None:
    with pytest.raises(ValueError, match=r"^clip_high must be a finite number > 0"):
        _example()["policy_loss"](
            **_batch(), config=SimpleNamespace(**{**vars(CONFIG), "clip_high": -1.0})
        )


def _rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        _, metrics = _example()["policy_loss"](
            **_batch(slice(3 * rank, 3 * rank + 3)), config=CONFIG
        )
        Path(out, f"rank{rank}.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


def test_the_example_on_two_processes_reduces_the_metrics(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    _, whole = _example()["policy_loss"](**_batch(), config=CONFIG)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == pytest.approx(whole, rel=1e-6, nan_ok=True), rank
    halves = [
        _example()["policy_loss"](**_batch(slice(i, i + 3)), config=CONFIG)[1] for i in (0, 3)
    ]
    assert halves[0] != pytest.approx(whole)  # a process's own metrics are not the batch's
