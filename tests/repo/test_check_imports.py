"""``scripts/check_imports.py`` (run by ``make lint``): every import of the repository's own
modules, inside functions too, names a module that exists and a name it binds. A renamed name
broke ``make figures-vllm`` (``gmpo_trl.cli.runs.VLLM_HEADS``, imported inside a function of
benchmarks/bench_vllm_runs.py) and nothing noticed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_imports.py"


def run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=120
    )


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_repository_imports_only_what_exists() -> None:
    start = time.monotonic()
    proc = run(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - start < 30  # reading, not importing: about a second
    checked = int(proc.stdout.split()[1])  # "check_imports: N imports of the repository's own..."
    assert checked > 500


def test_a_bad_import_fails(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "from .mod import X\n",
        "pkg/mod.py": "X = 1\nif X:\n    Z = 2\ntry:\n    W = 3\nexcept ImportError:\n    pass\n"
                      "def f():\n    global G\n    G = 1\nclass C: ...\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "from .. import mod\nfrom ..mod import C, Z\nfrom . import nothere\n",
        "pkg/lazy.py": "def __getattr__(name):\n    return name\n",
        "bench/_common.py": "RESULTS = 1\n",
        "bench/run.py": (
            "import numpy\nfrom numpy import no_such_numpy_name\n"  # others' packages: not read
            "from _common import RESULTS, GONE\n"
            "import pkg.sub.deep\nimport pkg.nope\n"
            "from pkg import sub, mod, X, lazy\nfrom pkg.lazy import anything\n"
            "def child():\n"
            "    from pkg.mod import X, W, G, VLLM_HEADS\n"
        ),
    })  # fmt: skip
    proc = run(tmp_path)
    assert proc.returncode == 1
    found = sorted(line for line in proc.stdout.splitlines() if ": " in line and "/" in line)
    assert found == [
        "bench/run.py:3: from _common import GONE: _common has no GONE",
        "bench/run.py:5: import pkg.nope: no module pkg.nope",
        "bench/run.py:9: from pkg.mod import VLLM_HEADS: pkg.mod has no VLLM_HEADS",
        "pkg/sub/deep.py:3: from pkg.sub import nothere: pkg.sub has no nothere",
    ], proc.stdout
