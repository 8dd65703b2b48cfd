"""verl 0.9.1 on a CPU-only machine (the smoke test, the tests and verl_cpu/figures.py). Not
part of the shipped package.

Import it before verl resolves its platform, in every process: ``torchrun`` scripts import it
first thing; ``python -m verl.trainer.main_ppo`` gets it through
``VERL_USE_EXTERNAL_MODULES=verl_cpu.cpu_support`` (verl imports those modules on
``import verl``, in the driver and in every Ray worker, which inherit the environment), with
``VERL_PLATFORM=cpu`` and ``VERL_ENGINE_DEVICE=cuda``. It

- registers a ``cpu`` platform (verl registers ``nvidia``, ``npu`` and ``rocm`` only); its Ray
  resource is ``GPU``, so start Ray with logical GPUs (``+ray_kwargs.ray_init.num_gpus=N``):
  verl's resource check counts only GPUs and NPUs;
- makes ``initialize_global_process_group_ray`` ask for plain ``gloo`` (verl builds
  ``"cpu:gloo,<device>:<backend>"``, a duplicate device type on CPU);
- registers the ``hf`` rollout (:mod:`verl_cpu.hf_rollout`) in verl's two rollout registries.

Every patch checks that the verl internal it touches is still there and raises
:class:`VerlMovedError` naming it otherwise.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch


class VerlMovedError(RuntimeError):
    """A verl internal this test support relies on is gone or changed (verl is not 0.9.1)."""


def _require(module_name: str, attribute: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise VerlMovedError(
            f"verl_cpu (verl CPU support): cannot import {module_name}: {error}"
        ) from error
    if not hasattr(module, attribute):
        raise VerlMovedError(
            f"tests/verl CPU support: {module_name}.{attribute} is gone (written for verl 0.9.1)"
        )
    return module


# ---------------------------------------------------------------------------------------------
# the platform
# ---------------------------------------------------------------------------------------------
_platform_base = _require("verl.plugin.platform.platform_base", "PlatformBase")
_platform_manager = _require("verl.plugin.platform.platform_manager", "PlatformRegistry")


class _CPUDevice:
    """``torch.cpu`` plus the ``torch.cuda``-style calls verl makes (memory stats, caches)."""

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        return lambda *args, **kwargs: 0

    def mem_get_info(self, *args: Any) -> tuple[int, int]:
        return (0, 0)

    def get_device_name(self, *args: Any) -> str:
        return "CPU"  # verl.utils.flops_counter matches a name string against its table


class CPUPlatform(_platform_base.PlatformBase):  # type: ignore[misc,name-defined]
    """A CPU platform for verl in tests (verl 0.9.1 registers nvidia, npu and rocm only)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return _CPUDevice()

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        return "cpu"  # verl moves tensors with .to(current_device())

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return (None, None)

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CPU_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str) -> Any:
        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        # logical GPUs: verl's RayResourcePool._check_resource_available counts GPU/NPU only
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


_platform_manager.PlatformRegistry.register(platform="cpu")(CPUPlatform)


# ---------------------------------------------------------------------------------------------
# the process group: plain gloo
# ---------------------------------------------------------------------------------------------
_distributed = _require("verl.utils.distributed", "initialize_global_process_group_ray")
_original_init = _distributed.initialize_global_process_group_ray


def _initialize_gloo(timeout_second: Any = None, backend: str | None = None) -> None:
    """verl's default backend is ``cpu:gloo,<device>:<backend>`` = ``cpu:gloo,cpu:gloo`` here,
    which torch rejects (duplicate device type); every device type maps to gloo on CPU."""
    if backend is None or backend.startswith("cpu:gloo"):
        backend = "gloo"
    _original_init(timeout_second=timeout_second, backend=backend)


if getattr(_original_init, "__name__", "") != "_initialize_gloo":  # imported twice: once
    # modules that import it later (engine workers, checkpoint engine) bind this one by name
    _distributed.initialize_global_process_group_ray = _initialize_gloo


# ---------------------------------------------------------------------------------------------
# the hf rollout in verl's two registries
# ---------------------------------------------------------------------------------------------
_HF_MODULE = f"{__name__.rpartition('.')[0]}.hf_rollout".lstrip(".")


def _load_hf_replica() -> Any:
    return importlib.import_module(_HF_MODULE).HFReplica


def register_hf_rollout() -> None:
    base = _require("verl.workers.rollout.base", "_ROLLOUT_REGISTRY")
    replica = _require("verl.workers.rollout.replica", "RolloutReplicaRegistry")
    if not isinstance(base._ROLLOUT_REGISTRY, dict):
        raise VerlMovedError("verl.workers.rollout.base._ROLLOUT_REGISTRY is no longer a dict")
    base._ROLLOUT_REGISTRY["hf", "async"] = f"{_HF_MODULE}.HFServerAdapter"
    replica.RolloutReplicaRegistry.register("hf", _load_hf_replica)


register_hf_rollout()
