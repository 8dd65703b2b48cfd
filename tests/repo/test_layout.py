"""The repository's layout rules: nothing outside tests/ imports from it (scripts, benchmarks,
examples and the packages share what they share from where all of them can import it); no
import cycle; no module over 400 lines but the reference; no two modules of one name in the
packages; no ``sys.path`` manipulation in tests or benchmarks; the core on public torch only;
results/ small in git."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def installed_packages(setuptools: dict[str, Any]) -> dict[str, Path]:
    """Each package that pyproject.toml installs (``[tool.setuptools] packages``) and its
    folder: ``package-dir``'s for the package or the nearest package above it, else the package
    path below the repository root."""
    where = setuptools.get("package-dir", {})
    out = {}
    for name in setuptools["packages"]:
        parts = name.split(".")
        for n in range(len(parts), -1, -1):
            prefix = ".".join(parts[:n])
            if n == 0 or prefix in where:
                base = ROOT / where[prefix] if n else ROOT
                out[name] = base.joinpath(*parts[n:])
                break
    return out


PACKAGES = installed_packages(SETUPTOOLS)
#: importable code that no wheel installs, imported from the repository root
UNINSTALLED = ("studies", "verl_cpu")
#: where importable code lives: the package root of each top-level name
PACKAGE_ROOTS = {
    **{name: folder.parent for name, folder in PACKAGES.items() if "." not in name},
    **{name: ROOT for name in UNINSTALLED},
}
#: code outside tests that every check below covers: the packages' folders, then the rest
CODE = (
    *(str(PACKAGE_ROOTS[name].joinpath(name).relative_to(ROOT)) for name in PACKAGE_ROOTS),
    "benchmarks", "scripts", "examples",
)  # fmt: skip
# ``from tests...``, ``import tests...``, ``python -m tests....`` and module paths in strings
_USES_TESTS = re.compile(r"(^\s*(from|import)\s+tests\b)|(-m\s+tests\.)|([\"']tests\.\w)", re.M)


def test_nothing_outside_tests_imports_from_tests() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}"
        for folder in CODE
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


def test_the_checks_read_every_package_of_pyproject() -> None:
    """The packages come from pyproject.toml (a package added there is checked below, its
    ``package-dir`` read); each is a folder of modules the checks read, and every folder of
    importable code at the root or in adapters/ is one of them or of :data:`UNINSTALLED`."""
    fake = {"packages": ["a", "b", "b.c"], "package-dir": {"b": "x/b"}}
    assert installed_packages(fake) == {"a": ROOT / "a", "b": ROOT / "x/b", "b.c": ROOT / "x/b/c"}
    modules = _package_modules()
    assert [name for name, folder in PACKAGES.items()
            if name not in modules or modules[name] != folder / "__init__.py"] == []  # fmt: skip
    found = {
        p.parent.name for base in (ROOT, ROOT / "adapters") for p in base.glob("*/__init__.py")
    }
    assert found - {"tests"} == set(PACKAGE_ROOTS)


def test_every_package_data_glob_matches_a_file() -> None:
    """``[tool.setuptools.package-data]``: each glob matches a file of its package (a glob that
    matches none ships nothing and says it ships something)."""
    data = SETUPTOOLS.get("package-data", {})
    empty = [f"{name}: {glob}" for name, globs in data.items() for glob in globs
             if not any(PACKAGES[name].glob(glob))]  # fmt: skip
    assert set(data) <= set(PACKAGES) and empty == []


def _module_name(path: Path) -> str:
    for top, root in PACKAGE_ROOTS.items():
        if path.is_relative_to(root / top):
            parts = path.relative_to(root).with_suffix("").parts
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


def _package_modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for top, root in PACKAGE_ROOTS.items()
        for path in sorted((root / top).rglob("*.py"))
    }


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package modules ``path`` (module ``name``) imports, anywhere in it (a function's
    lazy import too: a cycle through one is still a cycle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1],
                                 *([base] if base else [])])  # fmt: skip
            # a submodule by name, or a name the module (package) defines
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]  # fmt: skip
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    """The packages' modules import each other without a cycle (a package imports its own
    submodules from ``__init__``; a submodule never imports its package's ``__init__`` back)."""
    modules = _package_modules()
    graph = {name: _imports(path, name, set(modules)) for name, path in modules.items()}
    assert graph["gmpo_trl.cli.parsing"], "the import graph found no edges: the parser is broken"
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


MAX_LINES = 400


def test_no_module_over_400_lines_but_the_reference() -> None:
    """A module a reader can hold in their head; the float64 reference is one derivation, kept
    whole on purpose (tests are held to the same limit)."""
    long = {
        str(path.relative_to(ROOT)): n
        for folder in (*CODE, "tests")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    long.pop("gmpo_core/reference.py", None)
    assert long == {}


#: module names that two packages share, each doing one job in each (the verl adapter's policy
#: loss is verl's entry point over gmpo_core's loss)
SHARED_NAMES = {"__init__", "__main__", "loss"}


def test_no_two_modules_of_one_name_in_the_packages() -> None:
    seen: dict[str, list[str]] = {}
    for name in _package_modules():
        seen.setdefault(name.rpartition(".")[2], []).append(name)
    twice = {k: v for k, v in seen.items() if len(v) > 1 and k not in SHARED_NAMES}
    assert twice == {}


_SYS_PATH = re.compile(r"sys\.path\.(insert|append|extend)|syspath_prepend|sys\.path\s*=")


def test_no_sys_path_manipulation_in_tests_or_benchmarks() -> None:
    """Tests and benchmarks import the packages as installed (or from PYTHONPATH), never by
    editing ``sys.path``: what they import is what a user imports."""
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("tests", "benchmarks", "studies")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "test_layout.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _SYS_PATH.search(line)
    ]
    assert offenders == []


#: a citation of an internal issue: the word "issue" and its number, which no
#: contributor can look up
_ISSUE = re.compile(r"\bissues?\s+#?\d+", re.I)


def test_nothing_cites_an_internal_issue_number() -> None:
    """The repository cites docs/semantics.md's rules (S-numbers) or the CHANGELOG's entries,
    never the numbers of issues kept elsewhere."""
    files = [path for folder in (*CODE, "tests", "docs", "results", ".ci")
             for path in sorted((ROOT / folder).rglob("*")) if path.is_file()]  # fmt: skip
    files += [ROOT / name for name in ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")]
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        if path.suffix not in (".png", ".gz", ".pt", ".pyc")
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _ISSUE.search(line)
    ]
    assert offenders == []


#: results/ in git: what the pages quote; raw per-step curves are regenerated by their make target
RESULTS_BYTES = 4_000_000


def test_results_hold_what_pages_quote_within_their_budget() -> None:
    """The files git tracks under results/ take at most :data:`RESULTS_BYTES`, and none is a
    sweep's raw curves (``curves.jsonl.gz``: they stay in runs/)."""
    listed = subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")  # fmt: skip
    files = [ROOT / name for name in listed if name]
    assert files, "git lists no file under results/"
    assert [f for f in files if f.name == "curves.jsonl.gz"] == []
    total = sum(f.stat().st_size for f in files if f.exists())
    assert total <= RESULTS_BYTES, f"results/ holds {total} bytes in git"
