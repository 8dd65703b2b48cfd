"""verl entry point (group ``verl.plugins``): importing this module registers ``loss_mode=gmpo``.

verl >= 0.9 imports it on ``import verl`` in every process (Ray workers included) and swallows
errors, so a failure is reported here instead. verl 0.8 loads no entry points: there set
``VERL_USE_EXTERNAL_MODULES=gmpo_verl.plugin`` (imported on ``import verl``, in every process that
inherits the environment); ``actor_rollout_ref.model.external_lib`` also imports it.

It also makes verl work beside trl >= 1.x in one environment (:mod:`gmpo_verl._trl_compat`).
"""

from gmpo_verl import _trl_compat
from gmpo_verl._registry import register_or_report

_trl_compat.apply()
register_or_report()
