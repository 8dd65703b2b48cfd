"""verl beside trl (``gmpo_verl._trl_compat``, applied by the ``gmpo_verl.plugin`` entry point).

verl 0.9.1 imports trl's ``AutoModelForCausalLMWithValueHead`` whenever
``verl.utils.import_utils.is_trl_available()`` is True; trl 1.x no longer has it. The fix makes
the check say whether trl has the class. The end-to-end test (``test_main_ppo.py``) runs verl's
trainer in this environment, which has both packages, with no workaround of its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("verl")

from verl.utils import import_utils

from gmpo_verl import _trl_compat
from tests.verl import _versions

pytestmark = pytest.mark.verl

_PROBE = (
    "import sys, verl; from verl.utils import import_utils; "
    "import verl.models.transformers.monkey_patch as mp; "
    "print(import_utils.is_trl_available(), mp.is_trl_available(), 'gmpo_verl.plugin' in sys.modules)"
)


def _probe(**env: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
        env=os.environ | env, cwd=os.path.dirname(__file__),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()[-3:]


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl installed")
def test_entry_point_turns_verls_trl_check_off_for_this_trl() -> None:
    """This environment has trl 1.16, without the value-head model: with the entry point verl's
    check says False (in verl's model patching too); with entry points off, verl's own True."""
    if (reason := _versions.no_entry_points()) is not None:
        pytest.skip(reason)
    assert not _trl_compat.trl_has_value_head()
    assert _probe(VERL_USE_EXTERNAL_PLUGINS="auto") == ["False", "False", "True"]
    assert _probe(VERL_USE_EXTERNAL_PLUGINS="none") == ["True", "True", "False"]


@pytest.fixture
def fresh_check(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """verl's check as if the plugin had not run: an unpatched stand-in that says True."""
    calls = types.SimpleNamespace(n=0)

    def original() -> bool:
        calls.n += 1
        return True

    monkeypatch.setattr(import_utils, "is_trl_available", original)
    return calls


def _fake_trl(monkeypatch: pytest.MonkeyPatch, *, value_head: bool) -> None:
    trl = types.ModuleType("trl")
    ppo = types.ModuleType("trl.experimental.ppo")
    if value_head:
        ppo.AutoModelForCausalLMWithValueHead = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trl", trl)
    monkeypatch.setitem(sys.modules, "trl.experimental", types.ModuleType("trl.experimental"))
    monkeypatch.setitem(sys.modules, "trl.experimental.ppo", ppo)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())


@pytest.mark.parametrize("value_head", [True, False])
def test_check_follows_the_value_head_class(
    monkeypatch: pytest.MonkeyPatch, fresh_check: types.SimpleNamespace, value_head: bool
) -> None:
    _fake_trl(monkeypatch, value_head=value_head)
    assert _trl_compat.apply()
    patched = import_utils.is_trl_available
    assert patched() is value_head
    assert patched() is value_head  # cached, like verl's
    assert fresh_check.n == 1
    assert _trl_compat.apply()  # idempotent: not wrapped twice
    assert import_utils.is_trl_available is patched


def test_rebinds_modules_that_imported_the_check_before(
    monkeypatch: pytest.MonkeyPatch, fresh_check: types.SimpleNamespace
) -> None:
    _fake_trl(monkeypatch, value_head=False)
    binder = types.ModuleType("verl.models.transformers.monkey_patch")
    binder.is_trl_available = import_utils.is_trl_available  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, binder.__name__, binder)
    _trl_compat.apply()
    assert binder.is_trl_available is import_utils.is_trl_available
    assert binder.is_trl_available() is False


def test_without_trl_nothing_is_patched(
    monkeypatch: pytest.MonkeyPatch, fresh_check: types.SimpleNamespace
) -> None:
    original = import_utils.is_trl_available
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert not _trl_compat.apply()
    assert import_utils.is_trl_available is original
