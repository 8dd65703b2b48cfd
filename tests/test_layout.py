"""The repository's layout rules: nothing outside tests/ imports from it (scripts, benchmarks,
examples and the packages share what they share from where all of them can import it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ``from tests...``, ``import tests...``, ``python -m tests....`` and module paths in strings
_USES_TESTS = re.compile(r"(^\s*(from|import)\s+tests\b)|(-m\s+tests\.)|([\"']tests\.\w)", re.M)


def test_nothing_outside_tests_imports_from_tests() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}"
        for folder in ("gmpo_core", "adapters", "scripts", "benchmarks", "examples")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".sh") and _USES_TESTS.search(path.read_text(errors="replace"))
    ]
    assert offenders == []
