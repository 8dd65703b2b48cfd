"""gmpo_verl: ``loss_mode=gmpo`` for verl's PPO actor.

On verl >= 0.9, installing the package registers the losses in every process through verl's
``verl.plugins`` entry points (:mod:`gmpo_verl.plugin`). verl 0.8 does not load those: there
``VERL_USE_EXTERNAL_MODULES=gmpo_verl.plugin`` registers them in every process that inherits the
environment (Ray workers included), and :func:`register` in the calling process. Importing
``gmpo_verl`` itself imports neither verl nor torch.
"""

from __future__ import annotations

from typing import Any

from gmpo_verl._registry import LOSS_MODES, TESTED_VERL, check_verl_version, register

__all__ = [
    "LOSS_MODES",
    "TESTED_VERL",
    "check_verl_version",
    "compute_policy_loss_gmpo",
    "compute_policy_loss_gmpo_dual_clip",
    "register",
]


def __getattr__(name: str) -> Any:
    if name in ("compute_policy_loss_gmpo", "compute_policy_loss_gmpo_dual_clip"):
        from gmpo_verl import loss

        return getattr(loss, name)
    raise AttributeError(f"module 'gmpo_verl' has no attribute {name!r}")
