"""The repository's layout rules: nothing outside tests/ imports from it (scripts, benchmarks,
examples and the packages share what they share from where all of them can import it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


# a private torch name: ``torch._C``, ``torch._dynamo``, ``torch._functorch``, ...
_PRIVATE_TORCH = re.compile(r"\btorch\._[A-Za-z]")


def test_the_core_uses_public_torch_apis_only() -> None:
    """gmpo_core depends on torch's public API only: a private module or function may change
    or vanish in any release (a fallback to ``torch._C._functorch`` was once written for torch
    2.4, which lacks ``torch.func.debug_unwrap``)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "gmpo_core").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _PRIVATE_TORCH.search(line.split("#")[0])
    ]
    assert offenders == []
