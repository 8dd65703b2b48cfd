"""The docs site builds (``mkdocs build --strict``) and its math is marked up for MathJax."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def test_math_is_marked_up_and_mathjax_loaded(site: Path) -> None:
    html = (site / "index.html").read_text()
    # arithmatex turned the $$...$$ block into a MathJax display block, not raw text
    block = re.search(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', html, re.S)
    assert block is not None and r"\prod_t" in block.group(1)
    assert "$$" not in html
    assert 'src="javascripts/mathjax.js"' in html
    assert re.search(r'<script src="https://[^"]*mathjax@3[^"]*tex-mml-chtml\.js"', html)
    assert (site / "javascripts" / "mathjax.js").read_text().count("processHtmlClass") == 1
