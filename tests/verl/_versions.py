"""What the installed verl lacks, as skip reasons naming the release (None: it has it).

``make compat`` runs tests/verl at verl 0.8; the main run at verl 0.9.1."""

from __future__ import annotations

import importlib.util
from importlib.metadata import version
from pathlib import Path


def _verl() -> str:
    return f"verl {version('verl')}"


def no_entry_points() -> str | None:
    """verl >= 0.9 loads the ``verl.plugins`` entry points on ``import verl``; 0.8 does not
    (read in its ``verl/__init__.py``)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        return "verl is not installed"
    if "verl.plugins" in Path(spec.origin).read_text():
        return None
    return (
        f"{_verl()} does not load the verl.plugins entry points on `import verl` (verl >= 0.9 "
        "does): there VERL_USE_EXTERNAL_MODULES=gmpo_verl.plugin or gmpo_verl.register() "
        "registers the losses (tests/verl/test_compat.py)"
    )


def no_cpu_platform() -> str | None:
    """verl_cpu/cpu_support.py registers a CPU platform in ``verl.plugin.platform`` (verl 0.9);
    verl 0.8 has no platform registry."""
    if importlib.util.find_spec("verl.plugin") is not None:
        return None
    return (
        f"{_verl()} has no verl.plugin.platform (the platform registry in which the CPU test "
        "harness verl_cpu/cpu_support.py registers a CPU platform; verl 0.9 has it)"
    )


def no_loss_agg_mode(mode: str) -> str | None:
    """verl 0.9 accepts ``loss_agg_mode='token-sum'``; verl 0.8's actor config refuses it."""
    import inspect

    from verl.workers.config import actor

    if f'"{mode}"' in inspect.getsource(actor):
        return None
    return f"{_verl()}'s actor config has no loss_agg_mode={mode!r} (verl 0.9 added it)"


def no_v1_trainer() -> str | None:
    """The end-to-end harness (verl_cpu/e2e.py) sets ``trainer.use_v1``, verl 0.9's switch
    between its two trainers; verl 0.8's trainer config has no such key."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    config = Path(spec.origin).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    if config.exists() and "use_v1" in config.read_text():
        return None
    return (
        f"{_verl()}'s trainer config has no trainer.use_v1 (verl 0.9's choice of trainer, which "
        "the end-to-end harness verl_cpu/e2e.py sets)"
    )
