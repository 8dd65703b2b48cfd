"""The main job (examples/core_demo.py) learns its toy task: a GMPO end-to-end check."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

DEMO = pathlib.Path(__file__).parents[2] / "examples" / "core_demo.py"


@pytest.fixture(scope="module")
def demo():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("core_demo", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reward_rises_from_under_0_2_to_over_0_8(demo) -> None:  # type: ignore[no-untyped-def]
    history = demo.train(steps=40, seed=0, impl="plain", log_every=0)
    first = sum(r["reward"] for r in history[:5]) / 5
    last = sum(r["reward"] for r in history[-5:]) / 5
    assert first < 0.2, first
    assert last > 0.8, last
    # the second update of each batch is off-policy, so the log-ratio range is not degenerate
    assert max(r["log_ratio/max"] for r in history) > 0


def test_epsilon_shapes_the_run(demo) -> None:  # type: ignore[no-untyped-def]
    """A tiny clip range clips more than the paper's exp(±0.4) on the same seed."""
    wide = demo.train(steps=8, seed=1, impl="plain", log_every=0, epsilon=0.4)
    tight = demo.train(steps=8, seed=1, impl="plain", log_every=0, epsilon=0.01)
    clipped = lambda h: sum(r["clip_ratio/region_mean"] for r in h)  # noqa: E731
    assert clipped(tight) > clipped(wide)
