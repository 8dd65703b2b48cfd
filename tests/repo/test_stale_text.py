"""Text that tells a reader what to do or what ran stays true of the repository: the lists
docs/contributing.md says to edit are lists kept by hand (not read from pyproject.toml), the
test paths the compatibility reports name exist (and ``scripts/compat.py report`` refuses a
record whose paths do not), and the README's quickstart shows the clip at work."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _assigned(path: Path, name: str) -> ast.expr | None:
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.value  # type: ignore[attr-defined, no-any-return]
    return None


def test_the_lists_contributing_says_to_edit_are_kept_by_hand() -> None:
    """docs/contributing.md's "`path.py`'s `NAME`" (what else to touch): NAME is assigned in
    path.py to a literal a contributor edits (no comprehension: not computed from another
    source, such as pyproject.toml's packages)."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    cited = re.findall(r"`([\w/.]+\.py)`'s `(\w+)`", text)
    assert cited, "the page cites no list to edit: this test reads nothing"
    computed = []
    for path, name in cited:
        value = _assigned(ROOT / path, name)
        assert value is not None, f"{path} assigns no {name}"
        if isinstance(value, ast.Call) or any(
            isinstance(n, _COMPREHENSIONS) for n in ast.walk(value)
        ):
            computed.append(f"{path}'s {name}")
    assert computed == []


def _report_paths(page: Path) -> list[str]:
    """Every pytest path on the page's "- tests:" lines (options apart)."""
    return [p for line in re.findall(r"^- tests: `([^`]*)`", page.read_text(), re.M)
            for p in line.split() if not p.startswith("-") and p.startswith("tests")]  # fmt: skip


def test_the_compatibility_reports_name_tests_that_exist() -> None:
    pages = sorted((ROOT / "results").glob("*/*.md"))
    paths = [(page.relative_to(ROOT), p) for page in pages for p in _report_paths(page)]
    assert len(paths) > 10
    assert [f"{page}: {p}" for page, p in paths if not (ROOT / p).exists()] == []


def test_the_report_refuses_records_of_test_paths_not_in_the_checkout(tmp_path: Path) -> None:
    record = {"name": "min-torch", "blocking": True, "versions": {}, "status": "passed",
              "about": "x", "requirements": "torch", "install": "-e .[test]",
              "tests": "tests/core/test_compat.py tests/test_compat.py"}  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(record))
    out = tmp_path / "compat.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compat.py"), "report", str(tmp_path / "r.json"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "min-torch ran tests/test_compat.py, which is not in this checkout" in proc.stdout
    assert not out.exists()


def test_the_quickstart_runs_and_clips() -> None:
    """The README's quickstart, run as written: its printed metrics show tokens clipped (it
    printed clip_ratio/high_max: -0.0 and clipped nothing)."""
    block = re.search(r"## Quickstart\n\n```python\n(.*?)^```", (ROOT / "README.md").read_text(),
                      re.M | re.S)  # fmt: skip
    assert block is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.group(1), "README.md quickstart", "exec"), {})
    metrics = ast.literal_eval(printed.getvalue().strip().splitlines()[-1])
    assert metrics["clip_ratio/region_mean"] > 0, metrics
