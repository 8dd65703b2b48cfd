"""Test support for the negative control of ``test_main_ppo.py``: with verl's entry points off
(``VERL_USE_EXTERNAL_PLUGINS=none``), apply only the trl half of ``gmpo_verl.plugin``
(:mod:`gmpo_verl._trl_compat`), so that the run fails where the missing loss is looked up and
not earlier, when verl's engine imports trl's value-head model.
"""

from gmpo_verl import _trl_compat

_trl_compat.apply()
