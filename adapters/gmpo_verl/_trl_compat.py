"""verl 0.9 and trl >= 1.x in one environment (``pip install -e '.[trl,verl]'``).

verl's model patching (``verl.models.transformers.monkey_patch.apply_monkey_patch``, run when its
engine builds a model) asks ``verl.utils.import_utils.is_trl_available()`` and, when it says yes,
imports trl's PPO value-head model (``trl.experimental.ppo.AutoModelForCausalLMWithValueHead``,
else ``trl.AutoModelForCausalLMWithValueHead``). trl 1.x removed that class, so with both
packages installed verl's actor fails to build. :func:`apply` (run by :mod:`gmpo_verl.plugin`, so
in every process that imports verl) makes ``is_trl_available()`` answer the question verl means:
is trl installed *and* does it have the class verl imports. With a trl that has it, nothing
changes; without trl, nothing is patched. verl's critic value-head loader asks the same
question and gets the same, truthful answer.

The check imports trl only when verl calls ``is_trl_available()``, never at ``import verl``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
import warnings
from collections.abc import Callable

logger = logging.getLogger("gmpo_verl")

# where verl 0.9 looks for trl's value-head model, in its order
VALUE_HEAD_MODULES = ("trl.experimental.ppo", "trl")
VALUE_HEAD_CLASS = "AutoModelForCausalLMWithValueHead"
# verl modules that bind ``is_trl_available`` by name (``from ... import is_trl_available``)
_BINDERS = ("verl.models.transformers.monkey_patch", "verl.utils.model")
_MARK = "__gmpo_verl_trl_compat__"


def trl_has_value_head() -> bool:
    """True when one of verl's imports of ``AutoModelForCausalLMWithValueHead`` would succeed."""
    for module in VALUE_HEAD_MODULES:
        try:
            with warnings.catch_warnings():  # trl.experimental warns on import
                warnings.simplefilter("ignore")
                found = hasattr(importlib.import_module(module), VALUE_HEAD_CLASS)
        except ImportError:
            continue
        if found:
            return True
    return False


def _wrap(original: Callable[[], bool]) -> Callable[[], bool]:
    @functools.cache
    def is_trl_available() -> bool:
        return bool(original()) and trl_has_value_head()

    setattr(is_trl_available, _MARK, True)
    is_trl_available.__doc__ = (
        "verl's is_trl_available(), made False by gmpo_verl when the installed trl lacks "
        f"{VALUE_HEAD_CLASS} (trl >= 1.0), which is what verl imports when it is True."
    )
    return is_trl_available


def apply() -> bool:
    """Install the check if trl is installed; True if installed now or before. Idempotent."""
    if importlib.util.find_spec("trl") is None:
        return False
    try:
        import_utils = importlib.import_module("verl.utils.import_utils")
        original = import_utils.is_trl_available
    except (ImportError, AttributeError) as error:
        logger.warning(
            "gmpo_verl: verl.utils.import_utils.is_trl_available not found (%s); the trl "
            "compatibility fix is not applied (see docs/verl.md, 'verl and trl')",
            error,
        )
        return False
    if getattr(original, _MARK, False):
        return True
    patched = _wrap(original)
    import_utils.is_trl_available = patched
    for name in _BINDERS:  # modules imported before the plugin bound the original by name
        module = sys.modules.get(name)
        if module is not None and getattr(module, "is_trl_available", None) is original:
            module.is_trl_available = patched
    return True
