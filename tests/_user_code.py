"""What the study's and the CLI's tests stand in with: a process pool that runs every job at once in
this process (:class:`InlinePool`), and a user's own modules, as tests need them: run in a child process whose ``PYTHONPATH`` holds
them (what ``PYTHONPATH=. gmpo train --loss_variant mine:fn`` does), or loaded into this
process's ``sys.modules`` from a file (no ``sys.path`` edit: what is imported elsewhere is the
package as installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_with_modules(
    argv: list[str], folder: Path, modules: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python argv`` with each module (name -> source) written to ``folder``, which leads the
    child's ``PYTHONPATH`` (then the repository and its adapters)."""
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    path = os.pathsep.join([str(folder), str(ROOT), str(ROOT / "adapters")])
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": path},
        stdin=subprocess.DEVNULL,
    )


def load_module(
    monkeypatch: pytest.MonkeyPatch, folder: Path, name: str, source: str
) -> types.ModuleType:
    """Write ``source`` to ``folder/name.py`` and execute it as the module ``name`` in
    ``sys.modules`` (until the test ends): ``importlib.import_module(name)`` returns it, and
    ``inspect.getsource`` reads the file."""
    path = folder / f"{name}.py"
    path.write_text(source)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


class InlinePool:
    """A ProcessPoolExecutor that runs every job at once in this process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Any, *iterables: Any) -> list[Any]:
        return list(map(fn, *iterables))

    def submit(self, fn: Any, *args: Any) -> Future:
        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut
