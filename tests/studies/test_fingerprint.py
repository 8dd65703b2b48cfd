"""The fingerprint of a variant's definition (studies/stability/fingerprint.py), the key under
which the study caches its runs: a change to what a variant runs changes it (a class it uses, a
bound method, a function among its defaults or ``functools.partial`` arguments, the host's code
and version for the hosts' losses), and it is the same in every process (the run cache through
the sweep: test_stability.py)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from studies.stability.fingerprint import fingerprint
from tests._user_code import ROOT, load_module

_LOSS = "(lp - old).sum() * {}"
#: variant modules, each with ``fn`` and a ``{}`` where the loss's factor goes
DEFINITIONS = {
    "bound method": f"class Loss:\n    def loss(self, lp, old, a, m):\n        return {_LOSS}\n\n"
    "fn = Loss().loss\n",
    "class it calls": f"class Scale:\n    def __call__(self, lp, old, a, m):\n        return {_LOSS}"
    "\n\ndef fn(lp, old, a, m):\n    return Scale()(lp, old, a, m)\n",
    "inherited __call__": f"class Base:\n    def __call__(self, lp, old, a, m):\n        return "
    f"{_LOSS}\n\nclass Loss(Base):\n    pass\n\nfn = Loss()\n",
    "static method": "class H:\n    @staticmethod\n    def f(x):\n        return x * {}\n\n"
    "def fn(lp, old, a, m):\n    return H.f((lp - old).sum())\n",
    "object it reads": "class H:\n    def f(self, x):\n        return x * {}\n\nh = H()\n\n"
    "def fn(lp, old, a, m):\n    return h.f((lp - old).sum())\n",
    "partial argument": "import functools\n\ndef scale(x):\n    return x * {}\n\n"
    "def loss(lp, old, a, m, scale):\n    return scale((lp - old).sum())\n\n"
    "fn = functools.partial(loss, scale=scale)\n",
    "default": "def scale(x):\n    return x * {}\n\n"
    "def fn(lp, old, a, m, scale=scale):\n    return scale((lp - old).sum())\n",
    "import in its body": "def fn(lp, old, a, m):\n    from fp_helper_mod import scale\n\n"
    "    return scale((lp - old).sum())\n",
}
_HELPER = "def scale(x):\n    return x * {}\n"


# Regression: the fingerprint named a class a variant calls or reads, and a bound method's class
# and the code it runs (its function), without reading their source; it wrote a function among a
# variant's defaults or partial arguments as its repr, a memory address, new in every import; it
# did not follow an import in a variant's body. A changed class or helper reused stale runs, an
# unchanged one never reused its runs.
@pytest.mark.parametrize("kind", DEFINITIONS)
def test_a_change_to_what_a_variant_runs_changes_its_fingerprint(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def define(factor: str) -> str:
        load_module(monkeypatch, tmp_path, "fp_helper_mod", _HELPER.format(factor))
        load_module(monkeypatch, tmp_path, "fp_variant_mod", DEFINITIONS[kind].format(factor))
        return fingerprint("fp_variant_mod:fn")

    first = define("1.0")
    assert define("1.0") == first  # the same definition, imported again
    assert define("2.0") != first  # the changed code it runs


# Regression: the hosts' variants were keyed by gmpo_variants' code alone: after a verl upgrade
# that changed its loss (or only its version), the dapo, gspo, cispo and sapo runs were reused.
def test_a_hosts_fingerprint_reads_verls_version_and_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("verl")
    from verl.trainer.ppo import core_algos

    from gmpo_variants import hosts

    before = {name: fingerprint(name) for name in ("dapo", "gspo")}
    version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda d: "0.0.1" if d == "verl" else version(d))  # fmt: skip
    assert fingerprint("dapo") != before["dapo"]  # another verl release
    monkeypatch.undo()
    assert fingerprint("dapo") == before["dapo"]
    # verl's code registered under dapo's loss_mode changes (here: another of verl's losses)
    registry = core_algos.POLICY_LOSS_REGISTRY
    monkeypatch.setitem(registry, "vanilla", registry["cispo"])
    hosts.host_loss.cache_clear()
    try:
        assert fingerprint("dapo") != before["dapo"]
        assert fingerprint("gspo") == before["gspo"]  # another loss_mode: unchanged
    finally:
        monkeypatch.undo()
        hosts.host_loss.cache_clear()
    assert fingerprint("dapo") == before["dapo"]


_FINGERPRINTS = (
    "import json\nfrom gmpo_variants import VARIANTS\n"
    "from studies.stability.fingerprint import fingerprint\n"
    "names = [*sorted(VARIANTS), 'fp_variant_mod:fn']\n"
    "print(json.dumps({name: fingerprint(name) for name in names}))\n"
)


# Regression: the hosts' variants (dapo, gspo, cispo, sapo) read verl through an lru_cache'd
# function, and a variant's function-valued partial argument or default was written as its repr:
# memory addresses, another fingerprint in each process, so a rerun recomputed every finished
# run of theirs instead of reusing it.
def test_every_variants_fingerprint_is_the_same_in_every_process(tmp_path: Path) -> None:
    (tmp_path / "fp_variant_mod.py").write_text(DEFINITIONS["partial argument"].format("1.0"))
    env = {**os.environ, "PYTHONHASHSEED": "random",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "adapters")])}  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-c", _FINGERPRINTS], stdout=subprocess.PIPE,
                              text=True, env=env, cwd=tmp_path) for _ in range(2)]  # fmt: skip
    first, second = (json.loads(p.communicate(timeout=300)[0]) for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert {"dapo", "gspo", "cispo", "sapo", "gmpo", "fp_variant_mod:fn"} <= first.keys()
    assert first == second
