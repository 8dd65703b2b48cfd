"""gmpo_tasks and the stability study need no TRL: with ``trl`` unimportable and its
distribution metadata missing (a machine where it was never installed), the tasks' catalog,
datasets and rewards, the variants and rules, and a short run of the study import and run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# installed before anything else is imported: `import trl` fails as if never installed, and
# importlib.metadata knows no distribution "trl"
_NO_TRL = """
import importlib.abc, importlib.metadata, sys

class NoTrl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "trl" or name.startswith("trl."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTrl())
_distribution = importlib.metadata.distribution

def distribution(name):
    if name.lower() == "trl":
        raise importlib.metadata.PackageNotFoundError(name)
    return _distribution(name)

importlib.metadata.distribution = distribution
importlib.metadata.version = lambda name: distribution(name).version
"""

_RUN = """
import json, torch
try:
    import trl
except ModuleNotFoundError:
    trl_absent = True
else:
    trl_absent = False
try:
    importlib.metadata.version("trl")
except importlib.metadata.PackageNotFoundError:
    metadata_absent = True
else:
    metadata_absent = False

from gmpo_tasks.catalog import TASKS
from gmpo_tasks.reverse import ReverseTask
from gmpo_stats.outcome import collapse
from gmpo_variants import VARIANTS
from studies.stability.run import Setup, rl_run, warm_start

task = ReverseTask(length=3)
prompts = task.prompts(4, seed=0)
rewards = TASKS["reverse"].reward(prompts, [p[:-1][::-1] for p in prompts])
setup = Setup(length=2, warm_steps=3, warm_batch=8, prompts=2, group=4, minibatches=2, steps=2)
curves = rl_run(setup, warm_start(setup, 0), "gmpo", 5e-3, None, 0)
print(json.dumps({
    "trl_absent": trl_absent, "metadata_absent": metadata_absent, "tasks": list(TASKS),
    "rewards": rewards, "variants": sorted(VARIANTS), "steps": len(curves["reward"]),
    "collapsed": collapse(curves["reward"]).collapsed,
    "trl_loaded": any(m == "trl" or m.startswith("trl.") for m in sys.modules),
}))
"""


def test_tasks_and_the_study_run_without_trl() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'adapters'}"}
    out = subprocess.run(
        [sys.executable, "-c", _NO_TRL + _RUN],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["trl_absent"] and got["metadata_absent"] and not got["trl_loaded"]
    assert got["tasks"][:3] == ["successor", "reverse", "add"] and got["rewards"] == [1.0] * 4
    assert "gmpo" in got["variants"] and got["steps"] == 2 and got["collapsed"] in (True, False)


def test_the_adapter_does_need_trl() -> None:
    """The same guard makes ``import gmpo_trl`` fail: the test above would see TRL if it were
    used (a guard that blocked nothing would pass it too)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'adapters'}"}
    out = subprocess.run(
        [sys.executable, "-c", _NO_TRL + "import gmpo_trl"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode != 0 and "PackageNotFoundError" in out.stderr
