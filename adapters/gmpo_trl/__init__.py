"""gmpo_trl: GMPO (arXiv 2507.20673) as the policy loss of TRL's ``GRPOTrainer``.

``from gmpo_trl import GMPOConfig, GMPOTrainer`` is a drop-in for ``trl.experimental.gmpo`` whose
GMPO math is :func:`gmpo_core.gmpo_loss`, and which honours or refuses every GRPOConfig field
(``gmpo_trl.fields.FIELDS``). Importing it warns once when the installed TRL is older than the
supported range (trl >= 1.10, as pyproject.toml declares); TRL's warning about the vLLM version,
which it repeats six times, is said once, where vLLM is used
(``gmpo_trl.vllm_cpu.quiet_trls_vllm_warning``).

``GMPOConfig`` and ``GMPOTrainer`` are imported on first use (they import TRL's trainer stack,
transformers and torch, several seconds): ``import gmpo_trl`` and the ``gmpo --help`` that
depends on it stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gmpo_trl.compat import warn_if_unsupported
from gmpo_trl.vllm_cpu import quiet_trls_vllm_warning

warn_if_unsupported()
quiet_trls_vllm_warning()

if TYPE_CHECKING:
    from gmpo_trl.config import GMPOConfig
    from gmpo_trl.trainer import GMPOTrainer

__all__ = ["GMPOConfig", "GMPOTrainer"]


def __getattr__(name: str) -> Any:
    if name == "GMPOConfig":
        from gmpo_trl.config import GMPOConfig

        return GMPOConfig
    if name == "GMPOTrainer":
        from gmpo_trl.trainer import GMPOTrainer

        return GMPOTrainer
    raise AttributeError(f"module 'gmpo_trl' has no attribute {name!r}")
