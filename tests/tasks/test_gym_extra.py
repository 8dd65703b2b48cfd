"""The reasoning-gym tasks without reasoning_gym: the catalog imports none of it, and every way
to run such a task refuses in one line naming the extra (the rest: test_gym_tasks.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gmpo_tasks.catalog import TASKS, check_available

ROOT = Path(__file__).resolve().parents[2]
GYM = ("chain_sum", "countdown", "spell_backward")


def _path() -> str:
    """The PYTHONPATH of a child process: the checkout and where this one finds its packages
    (reasoning_gym may come from a folder on this process's path)."""
    return ":".join([str(ROOT), str(ROOT / "adapters"), *filter(None, sys.path)])


def test_import_loads_no_reasoning_gym() -> None:
    code = ("import json, sys; import gmpo_tasks.catalog; "
            "print(json.dumps([m for m in ('reasoning_gym', 'sympy') if m in sys.modules]))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": _path(), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert json.loads(out.stdout) == []


def test_refused_in_one_line_without_reasoning_gym(monkeypatch, capsys) -> None:
    from studies.stability import __main__ as stability

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` fails
    for name in GYM:
        with pytest.raises(ValueError, match=r"pip install -e '\.\[gym\]'"):
            check_available(TASKS[name])
    check_available(TASKS["reverse"])  # a task that needs no extra
    monkeypatch.setattr(stability, "sweep", lambda *a: pytest.fail("reached the sweep"))
    with pytest.raises(SystemExit) as exc:
        stability.parse(["--task", "countdown", "--quick"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("python -m studies.stability: error: --task countdown: ") and (
        "reasoning-gym" in err and "pip install -e '.[gym]'" in err
    ), err
