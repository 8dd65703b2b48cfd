"""Registration: idempotence, clashes, the entry point, broken installs and the version warning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("verl")

from verl.trainer.ppo import core_algos

import gmpo_verl
from gmpo_verl import _registry
from tests.verl import _versions

pytestmark = pytest.mark.verl


def test_register_is_idempotent() -> None:
    gmpo_verl.register()
    first = {name: core_algos.get_policy_loss_fn(name) for name in gmpo_verl.LOSS_MODES}
    gmpo_verl.register()
    assert first["gmpo"] is gmpo_verl.compute_policy_loss_gmpo
    assert first["gmpo_dual_clip"] is gmpo_verl.compute_policy_loss_gmpo_dual_clip
    assert {name: core_algos.get_policy_loss_fn(name) for name in gmpo_verl.LOSS_MODES} == first


def test_registering_over_another_function_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def foreign(**kwargs: object) -> None:
        raise AssertionError("never called")

    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "gmpo_dual_clip", foreign)
    monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, "gmpo", raising=False)
    with pytest.raises(ValueError, match=r"'gmpo_dual_clip' is already registered.*foreign"):
        gmpo_verl.register()
    assert "gmpo" not in core_algos.POLICY_LOSS_REGISTRY  # all or nothing
    assert core_algos.POLICY_LOSS_REGISTRY["gmpo_dual_clip"] is foreign


def test_failed_registration_is_visible(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """verl logs plugin errors at debug level only: the entry point warns, and loss_mode=gmpo
    raises the cause when verl calls it instead of verl's generic 'Unsupported loss mode'."""

    def broken() -> None:
        raise ImportError("gmpo_core is broken")

    monkeypatch.setattr(_registry, "register", broken)
    for name in gmpo_verl.LOSS_MODES:
        monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, name, raising=False)
    with caplog.at_level(logging.WARNING, logger="gmpo_verl"):
        _registry.register_or_report()
    assert "gmpo_core is broken" in caplog.text
    fn = core_algos.get_policy_loss_fn("gmpo")
    with pytest.raises(RuntimeError, match=r"failed to register.*gmpo_core is broken"):
        fn(old_log_prob=None, log_prob=None, advantages=None, response_mask=None)
    monkeypatch.undo()
    gmpo_verl.register()  # a placeholder is gmpo_verl's own: a later register() replaces it
    assert core_algos.get_policy_loss_fn("gmpo") is gmpo_verl.compute_policy_loss_gmpo


@pytest.mark.parametrize(("version", "inside"), [("0.8.0", True), ("0.9.1", True),
                                                 ("0.9.4.dev0", True), ("0.10.0", True),
                                                 ("0.7.1", False), ("unknown", False)])  # fmt: skip
def test_version_warning(monkeypatch: pytest.MonkeyPatch, version: str, inside: bool) -> None:
    monkeypatch.setattr(_registry, "_version_checked", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gmpo_verl.check_verl_version(version) is inside
        gmpo_verl.check_verl_version(version)  # once per process
    assert len(caught) == (0 if inside else 1)
    if not inside:
        assert "supports verl >= 0.8 (tested with 0.8.0 and 0.9.1)" in str(caught[0].message)
        assert "\n" not in str(caught[0].message)


_LOOKUP = (
    "import sys, verl; from verl.trainer.ppo.core_algos import get_policy_loss_fn; "
    "fn = get_policy_loss_fn('gmpo'); get_policy_loss_fn('gmpo_dual_clip'); "
    "print(fn.__module__, 'gmpo_verl.plugin' in sys.modules)"
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env=os.environ | env, cwd=os.path.dirname(__file__),
    )  # fmt: skip


def test_entry_point_and_external_module_register_without_importing_gmpo_verl() -> None:
    """A fresh process: `import verl` loads the entry point; with entry points off,
    VERL_USE_EXTERNAL_MODULES=gmpo_verl.plugin (what external_lib does) registers too."""
    if (reason := _versions.no_entry_points()) is not None:
        pytest.skip(reason)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LOOKUP],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ | env,
            cwd=os.path.dirname(__file__),
        )
        for env in (
            {"VERL_USE_EXTERNAL_PLUGINS": "auto"},
            {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "gmpo_verl.plugin"},
        )
    ]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            assert out.split()[-2:] == ["gmpo_verl.loss", "True"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_importing_gmpo_verl_imports_neither_verl_nor_torch() -> None:
    result = _python("import sys, gmpo_verl; print(sorted({'verl', 'torch'} & set(sys.modules)))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
