"""`.ci/run` leaves the checkout as committed: its jobs write their reports under runs/.

`make compat` and `make vllm` write reports whose counts and times change on every run; the docs
quote the committed reports (tests/repo/test_doc_numbers.py), so a CI run that wrote over them
failed its own doc checks at the end.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()


def _make_lines(target: str) -> list[str]:
    return [line for line in CI.splitlines() if re.match(rf"\s*make {target}\b", line)]


@pytest.mark.parametrize(("target", "variable"), [("compat", "COMPAT_OUT"), ("vllm", "VLLM_OUT")])
def test_ci_writes_the_reports_under_runs(target: str, variable: str) -> None:
    lines = _make_lines(target)
    assert lines, f".ci/run does not run make {target}"
    for line in lines:
        match = re.search(rf"\b{variable}=(\S+)", line)
        assert match, f"{line!r} writes its report over the committed one"
        assert match.group(1).startswith("runs/"), line


def test_ci_fails_when_a_tracked_file_changed() -> None:
    guard = CI.find("git diff --exit-code")
    assert guard != -1
    assert guard > CI.find("make vllm") and guard < CI.rfind("\nmake test")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
@pytest.mark.parametrize(("target", "variable"), [("compat", "COMPAT_OUT"), ("vllm", "VLLM_OUT")])
def test_the_makefile_writes_where_it_is_told(target: str, variable: str) -> None:
    out = subprocess.run(
        ["make", "-n", target, f"{variable}=runs/elsewhere.md", "PY310=python3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")
    report = [line for line in out.splitlines() if "compat.py report" in line]
    assert len(report) == 1 and "--out runs/elsewhere.md" in report[0], out
