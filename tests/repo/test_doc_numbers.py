"""Every measured number in the checked docs pages is in a results file (scripts/doc_numbers.py).

A page is checked when it has an entry in ``doc_numbers.PAGES``; ``make figures`` regenerates the
results files the pages quote.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doc_numbers", ROOT / "scripts" / "doc_numbers.py")
assert _spec is not None and _spec.loader is not None
doc_numbers = importlib.util.module_from_spec(_spec)
sys.modules["doc_numbers"] = doc_numbers  # dataclasses look the module up
_spec.loader.exec_module(doc_numbers)


@pytest.mark.parametrize("page", sorted(doc_numbers.PAGES))
def test_page_quotes_only_results(page: str) -> None:
    problems = doc_numbers.check_page(page, doc_numbers.PAGES[page])
    assert problems == [], "\n".join(problems)


def test_the_pages_this_change_covers_are_checked() -> None:
    assert {"README.md", "docs/trl.md", "docs/lm_head.md"} <= set(doc_numbers.PAGES)


def _check(text: str, results: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(doc_numbers, "ROOT", tmp_path)
    (tmp_path / "r.md").write_text(results)
    (tmp_path / "page.md").write_text(text)
    return doc_numbers.check_page("page.md", doc_numbers.Page(results=("r.md",), **kw))


def test_a_number_not_in_the_results_is_reported(tmp_path, monkeypatch) -> None:
    results = "| time | 24.6931 s |\n| memory | 7,468,512,000 bytes, 0.0960 ratio |\n"
    page = "Took 24.69 s and 0.096× the memory, reward −0.42 → 0.74.\n"
    problems = _check(page, results, tmp_path, monkeypatch)
    assert [p.split(": ")[1].split(" ")[0] for p in problems] == ["-0.42", "0.74"]
    assert problems[0] == "page.md:1: -0.42 is in no results file of the page"


def test_rounding_is_at_the_written_precision(tmp_path, monkeypatch) -> None:
    results = "0.7197 1.45 3,480 7.53e-07 -4.9012\n"
    ok = "0.72 GB, 1.45×, 3,480 MB, 7.5e-7, [−4.90, ...]"
    assert _check(ok, results, tmp_path, monkeypatch) == []
    # off at the written precision, more digits than the results hold, or another sign
    bad = "0.722 GB, 1.453×, 3,481 MB, 7.6e-7, [4.90, ...]"
    assert len(_check(bad, results, tmp_path, monkeypatch)) == 5


def test_a_ratio_is_checked_whole(tmp_path, monkeypatch) -> None:
    """A ratio written 10.9x is the number 10.9, not 10 (which the results may hold elsewhere)."""
    results = "| 10 calls | 10.2x |\n"
    assert _check("10.2x and 10.2× faster", results, tmp_path, monkeypatch) == []
    problems = _check("10.9x faster", results, tmp_path, monkeypatch)
    assert problems == ["page.md:1: 10.9 is in no results file of the page"]


def test_reports_name_the_line(tmp_path, monkeypatch) -> None:
    page = "text\n```\ncode 1.5\nmore 2.5\n```\nthen 3.75 s\n"
    assert _check(page, "", tmp_path, monkeypatch) == [
        "page.md:6: 3.75 is in no results file of the page"
    ]


def test_what_is_not_a_measured_number(tmp_path, monkeypatch) -> None:
    page = (
        "Measured 2026-11-29 20:56 UTC with torch 2.13.0+cpu on 2 threads of Qwen2.5-Math-1.5B "
        "(bf16, H200). `--max_steps 150` [link](https://x.org/a/123.html)\n"
        "```bash\ngmpo train --learning_rate 0.005\n```\n"
        "trl 1.16 at epsilon 0.4.\n"
    )
    exempt = {"1.16": "a version", "0.4": "a hyper-parameter"}
    assert _check(page, "nothing\n", tmp_path, monkeypatch, exempt=exempt) == []
    # an exemption for a number the page no longer has is reported, and so is an unregistered
    # image
    stale = _check("![plot](img/x.png)\n", "", tmp_path, monkeypatch, exempt={"0.4": "gone"})
    assert len(stale) == 2 and "exemption '0.4'" in stale[0] and "img/x.png" in stale[1]


def test_a_missing_results_file_is_reported(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(doc_numbers, "ROOT", tmp_path)
    (tmp_path / "page.md").write_text("text\n")
    problems = doc_numbers.check_page("page.md", doc_numbers.Page(results=("nope/*.json",)))
    assert problems == ["page.md: no results file matches 'nope/*.json'"]


def test_a_figure_must_be_redrawn_by_make_figures(tmp_path, monkeypatch) -> None:
    makefile = (
        "figures: figures-a\n\n"
        "figures-a: setup\n\tpython draw.py\n\tcp out.png docs/img/a.png\n\n"
        "figures-b:\n\techo b\n"
    )
    (tmp_path / "Makefile").write_text(makefile)
    (tmp_path / "draw.py").write_text("savefig('docs/img/c.png')\n")
    page = "![a](img/a.png) ![b](img/b.png) ![c](img/c.png) ![d](img/d.png)\n"
    figures = {"img/a.png": "figures-a", "img/b.png": "figures-b", "img/c.png": "figures-a",
               "img/d.png": "figures-a"}  # fmt: skip
    problems = _check(page, "", tmp_path, monkeypatch, figures=figures)
    assert problems == [
        "page.md: img/b.png: figures-b is not a prerequisite of `make figures`",
        "page.md: img/d.png: neither `make figures-a` nor a script it runs writes it",
    ]


def test_the_regime_studys_counts_are_checked_against_its_analysis() -> None:
    """The pages that count the regime study's verdicts in words are tested against
    results/updates/updates.json (a count of 28 *same* passed the number check)."""
    counted = {n for n, p in doc_numbers.PAGES.items() if p.verdicts}
    assert {"README.md", "docs/regime.md", "docs/which_loss.md"} <= counted


def _analysis(tmp_path: Path, verdicts: list[str]) -> None:
    rows = {f"row {i}": {"verdict": v} for i, v in enumerate(verdicts)}
    (tmp_path / "a.json").write_text(json.dumps({"primary": rows, "other": {}}))


def test_a_wrong_count_of_verdicts_is_reported(tmp_path, monkeypatch) -> None:
    _analysis(tmp_path, ["same"] * 3 + ["inconclusive"])
    kw = {"verdicts": {"a.json": "primary"}}
    right = "Of the 4 primary rows, 3 are *same* and one is *inconclusive*; none *hurts*.\n"
    assert _check(right, "4 3\n", tmp_path, monkeypatch, **kw) == []
    assert _check("3 of 4 primary rows *same*, 1 *inconclusive*\n", "", tmp_path, monkeypatch,
                  **kw) == []  # fmt: skip
    # the wording of the README and docs/which_loss.md before the 2026-12-06 erratum, and a wrong total
    wrong = "4 of its 5 comparisons are the same within\n±0.05 and none inconclusive\n"
    assert _check(wrong, "4 5 0.05\n", tmp_path, monkeypatch, **kw) == [
        "page.md:1: 4 same rows, but a.json's primary family has 3",
        "page.md:1: 5 rows in all, but a.json's primary family has 4",
        "page.md:2: 0 inconclusive rows, but a.json's primary family has 1",
    ]


def test_an_erratum_quotes_the_old_count_in_inline_code(tmp_path, monkeypatch) -> None:
    _analysis(tmp_path, ["same", "inconclusive"])
    kw = {"verdicts": {"a.json": "primary"}}
    page = "It said `2 are *same*`; 1 is *same* and 1 *inconclusive*.\n"
    assert _check(page, "", tmp_path, monkeypatch, **kw) == []


def test_a_page_that_counts_verdicts_must_state_a_count(tmp_path, monkeypatch) -> None:
    _analysis(tmp_path, ["same"])
    kw = {"verdicts": {"a.json": "primary"}}
    assert _check("every row is *same*\n", "", tmp_path, monkeypatch, **kw) == [
        "page.md: states no count of 'a.json''s primary verdicts"
    ]
    assert _check("1 *same*\n", "", tmp_path, monkeypatch, verdicts={"b.json": "primary"}) == [
        "page.md: no analysis output 'b.json'"
    ]
