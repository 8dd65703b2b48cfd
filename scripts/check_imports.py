"""Every import of the repository's own modules names something that exists (``make lint``).

A module that no check imports rots: ``benchmarks/bench_vllm_runs.py`` imported
``gmpo_trl.cli.runs.VLLM_HEADS`` inside a function after the name had gone, and nothing noticed
until ``make figures-vllm`` ran. Importing every module would not have caught it (the import ran
only when the function did), would take the time of importing torch, TRL and verl, and could not
import what needs an environment of its own (vLLM's). So this reads instead of running: every
``import`` and ``from ... import`` of every Python file (git's tracked and untracked files, or
every file where there is no git), at any depth, whose first name is one of the repository's own
modules must name a module file, and each name it imports must be a submodule or a name the
module binds at its top level (a module with a ``__getattr__`` or a ``*`` import binds anything).

The repository's own modules: the packages at the root and in each ``package-dir`` of
pyproject.toml (``adapters/``), and, for a file outside any package (a script), the modules
beside it, as Python finds them. Imports of other distributions (numpy, TRL, vLLM) are not read:
their names are their releases' business, and pip and the tests check those.

    python scripts/check_imports.py [ROOT]    # exit status 1 and one line per broken import
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tomllib

#: folders never read where git does not list the files
_SKIPPED = {"__pycache__", "build", "dist", "site", "runs", "node_modules"}


def python_files(root: Path) -> list[Path]:
    """git's tracked and untracked (not ignored) ``.py`` files, else every one below ``root``
    outside hidden and build folders."""
    proc = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard",
         "--full-name", "*.py"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                         capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    if proc.returncode == 0 and top and Path(top).resolve() == root.resolve():
        return sorted(root / line for line in proc.stdout.splitlines() if (root / line).is_file())
    return sorted(
        p for p in root.rglob("*.py")
        if not any(part.startswith(".") or part in _SKIPPED for part in p.relative_to(root).parts)
    )  # fmt: skip


def search_roots(root: Path) -> list[Path]:
    """Where the repository's packages are found: the root, then each ``package-dir``'s parent
    folder (pyproject.toml's ``[tool.setuptools]``)."""
    roots = [root]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        setuptools = tomllib.loads(pyproject.read_text()).get("tool", {}).get("setuptools", {})
        for folder in setuptools.get("package-dir", {}).values():
            parent = (root / folder).parent
            if parent not in roots:
                roots.append(parent)
    return roots


def find_module(name: str, roots: list[Path]) -> Path | None:
    """The file (or namespace folder) of the dotted module ``name`` below one of ``roots``."""
    for base in roots:
        path = base.joinpath(*name.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
        if path.is_dir() and name.split(".")[0] != name:  # a namespace package below a package
            return path
        if path.is_dir() and any(path.glob("*.py")):  # a top-level namespace package
            return path
    return None


class Module:
    """What a module file binds at its top level (None: anything it is asked for)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: set[str] | None = set()
        if path.is_dir():  # a namespace package binds its submodules only
            return
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        self._bind(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.Global) and self.names is not None:
                self.names.update(node.names)

    def _bind(self, body: list[ast.stmt]) -> None:
        for node in body:
            if self.names is None:
                return
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == "__getattr__":
                    self.names = None
                    return
                self.names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            self.names.add(leaf.id)
            elif isinstance(node, ast.Import):
                self.names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if any(a.name == "*" for a in node.names):
                    self.names = None
                    return
                self.names.update(a.asname or a.name for a in node.names)
            else:  # if, try, with, for, while: their bodies bind at the top level too
                for field in ("body", "orelse", "finalbody"):
                    self._bind(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    self._bind(handler.body)


class Checker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.roots = search_roots(root)
        self._modules: dict[Path, Module] = {}
        self.checked = 0

    def module(self, path: Path) -> Module:
        if path not in self._modules:
            self._modules[path] = Module(path)
        return self._modules[path]

    def file_roots(self, path: Path) -> list[Path]:
        """Where ``path``'s absolute imports are found: a script's own folder first (Python puts
        it first on sys.path), then the repository's roots."""
        if (path.parent / "__init__.py").is_file():
            return self.roots
        return [path.parent, *self.roots]

    def package_of(self, path: Path) -> tuple[Path, str]:
        """The folder that holds ``path``'s top-level package, and ``path``'s package name."""
        folder, parts = path.parent, []
        while (folder / "__init__.py").is_file():
            parts.insert(0, folder.name)
            folder = folder.parent
        return folder, ".".join(parts)

    def check_file(self, path: Path) -> list[str]:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        roots = self.file_roots(path)
        shown = path.relative_to(self.root).as_posix()
        out = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if find_module(alias.name.split(".")[0], roots) is None:
                        continue  # another distribution's
                    self.checked += 1
                    if find_module(alias.name, roots) is None:
                        out.append(f"{shown}:{node.lineno}: import {alias.name}: no module "
                                   f"{alias.name}")  # fmt: skip
            elif isinstance(node, ast.ImportFrom):
                where, name = roots, node.module or ""
                if node.level:
                    base, package = self.package_of(path)
                    package_parts = package.split(".") if package else []
                    keep = len(package_parts) - (node.level - 1)
                    name = ".".join([*package_parts[: max(keep, 0)], *([name] if name else [])])
                    where = [base]
                elif find_module(name.split(".")[0], roots) is None:
                    continue  # another distribution's
                out += self._check_from(shown, node, name, where)
        return out

    def _check_from(
        self, shown: str, node: ast.ImportFrom, name: str, where: list[Path]
    ) -> list[str]:
        found = find_module(name, where)
        self.checked += 1
        if found is None:
            return [f"{shown}:{node.lineno}: from {name} import ...: no module {name}"]
        bound = self.module(found).names
        out = []
        for alias in node.names:
            if alias.name == "*" or bound is None or alias.name in bound:
                continue
            if found.name == "__init__.py" or found.is_dir():  # a package: its submodules too
                if find_module(f"{name}.{alias.name}", where) is not None:
                    continue
            out.append(f"{shown}:{node.lineno}: from {name} import {alias.name}: {name} has no "
                       f"{alias.name}")  # fmt: skip
        return out


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[1]).resolve()
    checker = Checker(root)
    problems = []
    files = python_files(root)
    for path in files:
        try:
            problems += checker.check_file(path)
        except SyntaxError as err:  # ruff reports it too; here it is one more line
            problems.append(f"{path.relative_to(root).as_posix()}:{err.lineno}: {err.msg}")
    for line in problems:
        print(line)
    print(f"check_imports: {checker.checked} imports of the repository's own modules in "
          f"{len(files)} files, {len(problems)} broken")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
