"""``apply_workaround`` sets vLLM's private names only where vLLM has them: where one is gone (a
vLLM that renamed or removed it), it changes nothing, warns once and returns False, since setting
a name nothing reads would leave TRL's weight sync failing behind a reported success.

vLLM is faked here (modules in ``sys.modules``), so these run in every environment; not
vllm-marked, they run in ``make test`` (``make vllm`` selects ``-m vllm``)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

pytest.importorskip("trl")  # gmpo_trl's import checks TRL's version

from gmpo_trl import vllm_cpu

#: the modules of vLLM 0.32 holding the two names (gmpo_trl.vllm_cpu.WORKAROUND_NAMES)
OPS, UTILS = "vllm._custom_ops", "vllm.model_executor.layers.utils"


def vllm_sgl_kernel(n: int, k: int, dtype: object) -> bool:
    return True  # what vLLM's check answers for a small bf16 weight on an AMX CPU


@pytest.fixture
def fake_vllm(monkeypatch):
    """A vLLM on the CPU with both names (delete one to fake a vLLM without it); its modules."""
    modules = {
        name: types.ModuleType(name)
        for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers", OPS, UTILS)
    }
    modules[OPS]._supports_onednn = True
    modules[UTILS].check_cpu_sgl_kernel = vllm_sgl_kernel
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(vllm_cpu, "vllm_on_cpu", lambda: True)
    monkeypatch.setattr(vllm_cpu, "_version", lambda: "9.9.9")
    monkeypatch.setattr(vllm_cpu, "_state", {"applied": False, "missing": False})
    monkeypatch.setattr(vllm_cpu, "replaced", {}, raising=False)
    return modules


def test_the_names_are_vllms():
    assert [module for module, _ in vllm_cpu.WORKAROUND_NAMES] == [OPS, UTILS]


def logged(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "gmpo_trl.vllm_cpu"]


def test_applied_where_both_names_exist(fake_vllm, caplog):
    with caplog.at_level(logging.WARNING, logger="gmpo_trl.vllm_cpu"):
        assert vllm_cpu.apply_workaround() is True
        assert vllm_cpu.apply_workaround() is True
    assert fake_vllm[OPS]._supports_onednn is False
    assert fake_vllm[UTILS].check_cpu_sgl_kernel(96, 32, "bf16") is False
    assert vllm_cpu.replaced == {"check_cpu_sgl_kernel": vllm_sgl_kernel}
    (line,) = logged(caplog)
    assert "its linear weights kept plain" in line


@pytest.mark.parametrize("gone", ["_supports_onednn", "check_cpu_sgl_kernel"])
def test_not_applied_where_a_name_is_gone(fake_vllm, caplog, gone):
    module = fake_vllm[OPS if gone == "_supports_onednn" else UTILS]
    delattr(module, gone)
    with caplog.at_level(logging.WARNING, logger="gmpo_trl.vllm_cpu"):
        assert vllm_cpu.apply_workaround() is False
        assert vllm_cpu.apply_workaround() is False
    assert not hasattr(module, gone)  # not created
    assert getattr(fake_vllm[OPS], "_supports_onednn", True) is True  # nothing changed
    assert getattr(fake_vllm[UTILS], "check_cpu_sgl_kernel", vllm_sgl_kernel) is vllm_sgl_kernel
    (line,) = logged(caplog)
    assert f"vLLM 9.9.9 has no {module.__name__}.{gone}: the workaround" in line
    assert "is not applied" in line


def test_nothing_where_vllm_is_not_on_the_cpu(fake_vllm, monkeypatch, caplog):
    monkeypatch.setattr(vllm_cpu, "vllm_on_cpu", lambda: False)
    with caplog.at_level(logging.WARNING, logger="gmpo_trl.vllm_cpu"):
        assert vllm_cpu.apply_workaround() is False
    assert fake_vllm[OPS]._supports_onednn is True
    assert fake_vllm[UTILS].check_cpu_sgl_kernel is vllm_sgl_kernel
    assert not logged(caplog)
