"""Registration of the GMPO policy losses in verl's ``POLICY_LOSS_REGISTRY``.

Nothing here imports verl, torch or :mod:`gmpo_core` at module level: the entry-point module
(:mod:`gmpo_verl.plugin`) must be able to report a broken install, which verl itself would only
log at debug level.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any

logger = logging.getLogger("gmpo_verl")

#: The loss modes this package registers, in verl's ``policy_loss.loss_mode``.
LOSS_MODES = ("gmpo", "gmpo_dual_clip")
#: the oldest verl this adapter supports (major, minor; pyproject.toml's ``verl>=0.8``)
MIN_VERL = (0, 8)
#: verl releases this adapter is tested with (``make compat`` and the main test run)
TESTED_VERL = ("0.8.0", "0.9.1")
# marks a function as registered by gmpo_verl (so re-registering it, or a newer copy, is no clash)
_OWNER = "__gmpo_verl__"
_version_checked = False


def _losses() -> dict[str, Callable[..., Any]]:
    from gmpo_verl.loss import compute_policy_loss_gmpo, compute_policy_loss_gmpo_dual_clip

    losses = {
        "gmpo": compute_policy_loss_gmpo,
        "gmpo_dual_clip": compute_policy_loss_gmpo_dual_clip,
    }
    for fn in losses.values():
        setattr(fn, _OWNER, True)
    return losses


def check_verl_version(version: str | None = None) -> bool:
    """Warn (one line, once per process) when verl is older than the supported range (verl 0.7's
    default actor never fills ``global_batch_info``); True if inside."""
    global _version_checked
    if version is None:
        try:
            version = metadata.version("verl")
        except metadata.PackageNotFoundError:
            version = "unknown"
    parts = version.split(".")
    try:
        inside = (int(parts[0]), int(parts[1])) >= MIN_VERL
    except (IndexError, ValueError):
        inside = False
    if not inside and not _version_checked:
        warnings.warn(
            f"gmpo_verl supports verl >= {MIN_VERL[0]}.{MIN_VERL[1]} (tested with "
            f"{' and '.join(TESTED_VERL)}); found verl {version}: check that loss_mode=gmpo "
            "receives config.global_batch_info.",
            RuntimeWarning,
            stacklevel=3,
        )
    _version_checked = True
    return inside


def _owned(fn: object) -> bool:
    return bool(getattr(fn, _OWNER, False))


def register() -> None:
    """Register ``loss_mode=gmpo`` and ``loss_mode=gmpo_dual_clip`` with verl. Idempotent.

    Raises ``ValueError`` if either name is already registered to a function that is not
    gmpo_verl's (verl's own registry would silently overwrite it); nothing is registered then.
    """
    from verl.trainer.ppo import core_algos

    check_verl_version()
    losses = _losses()
    registry = core_algos.POLICY_LOSS_REGISTRY
    for name in losses:
        existing = registry.get(name)
        if existing is not None and not _owned(existing):
            where = f"{getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)}"
            raise ValueError(
                f"verl loss_mode {name!r} is already registered to {where}; gmpo_verl does not "
                "overwrite another package's policy loss"
            )
    for name, fn in losses.items():
        if registry.get(name) is not fn:
            core_algos.register_policy_loss(name)(fn)


def _failed_loss(name: str, error: BaseException) -> Callable[..., Any]:
    cause = f"{type(error).__name__}: {error}"

    def registration_failed(**kwargs: Any) -> Any:
        raise RuntimeError(
            f"loss_mode={name!r}: gmpo_verl failed to register with verl ({cause}). Run "
            "`python -c 'import gmpo_verl; gmpo_verl.register()'` for the full traceback."
        ) from error

    setattr(registration_failed, _OWNER, True)
    return registration_failed


def register_or_report() -> None:
    """What the entry point runs: :func:`register`, and on failure a visible warning plus a
    placeholder under each free name that raises the cause when verl calls the loss."""
    try:
        register()
    except Exception as error:
        logger.warning("gmpo_verl: registering loss_mode=gmpo with verl failed: %s", error)
        try:
            from verl.trainer.ppo import core_algos
        except Exception:
            return
        for name in LOSS_MODES:
            if name not in core_algos.POLICY_LOSS_REGISTRY:
                core_algos.POLICY_LOSS_REGISTRY[name] = _failed_loss(name, error)
