"""Every measured number in the checked docs pages comes from a results file.

``make figures`` regenerates the results files (``results/<target>/``) and the
figures (``docs/img/``); the pages quote them. This script reads each page registered in
``PAGES``, takes every number in its prose and tables, and reports the ones that no number in
the page's results files rounds to (at the precision the page writes: ``0.72`` matches
``0.7197``, not ``0.74``). ``tests/repo/test_doc_numbers.py`` fails on any report.

Not numbers, on every page: fenced code blocks and inline code (commands, options, identifiers),
link targets, dates (2026-11-29) and times (20:56), dotted versions (2.13.0), single-digit
integers (counts of settings: "2 threads", "8 generations"; a measured quantity is written with
its unit or decimals), and digits inside words (Qwen2, bf16, H200, 1.5B).

Anything else that is not a measured number (a hyper-parameter, a size, a version written as
``trl 1.16``, a figure from the paper with its source) is exempted *per page* with the reason,
in ``scripts/doc_pages.json`` (read into ``PAGES``), so that a review sees each one. An
exemption that no longer occurs on its page is reported too.

To check a new page: add ``"path/to/page.md": {"results": [globs...], "exempt": {...},
"figures": {...}}`` to ``scripts/doc_pages.json``, run ``python scripts/doc_numbers.py
path/to/page.md``, and for each number reported either point the page at the results file that
holds it, regenerate it, or exempt it with a reason.

    python scripts/doc_numbers.py            # every registered page; exit 1 on any report
    python scripts/doc_numbers.py README.md  # one page
"""

from __future__ import annotations

import glob
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Page:
    #: globs (from the repository root) of the results files the page quotes
    results: tuple[str, ...]
    #: number as the page writes it (commas dropped, "−" as "-") -> why it is not measured
    exempt: dict[str, str] = field(default_factory=dict)
    #: every image the page shows -> the Makefile target (a prerequisite of `figures`) whose
    #: recipe, or a script it runs, writes it
    figures: dict[str, str] = field(default_factory=dict)


# The registered pages: their results files (the Markdown results only: the JSON beside each
# holds every repeat, and the more numbers a page is compared with, the likelier a wrong number
# matches one by chance), their exemptions with the reason for each, and their figures.
PAGES: dict[str, Page] = {
    name: Page(
        results=tuple(entry["results"]),
        exempt=entry.get("exempt", {}),
        figures=entry.get("figures", {}),
    )
    for name, entry in json.loads((ROOT / "scripts" / "doc_pages.json").read_text()).items()
}

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)|<https?://[^>]*>|https?://\S+")
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_NOT_NUMBERS = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b"  # dates
    r"|\b\d{1,2}:\d{2}\b"  # times
    r"|\b\d+\.\d+\.\d+[\w.+-]*"  # dotted versions 2.13.0, 2.13.0+cpu
)
# a number: optional sign (not after a word character), digits with optional thousands commas,
# decimals, an exponent, a trailing ".x" (1.16.x), a ratio's "x" or "×" (10.9x); not inside a word
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-−+]?)(?P<body>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?P<exp>e[-−+]?\d+)?(?P<x>\.x)?(?:×|x(?=[\s|,.;:)]|$))?(?![\w])"
)
_RESULT_NUMBER = re.compile(r"[-−+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-−+]?\d+)?")


def prose(text: str) -> str:
    """The page without what holds no quoted measurement (see the module docstring)."""
    for pattern in (_FENCE, _HTML_COMMENT, _INLINE_CODE, _LINK_TARGET, _NOT_NUMBERS):
        text = pattern.sub(lambda m: "\n" * m.group(0).count("\n") or " ", text)  # lines kept
    return text


@dataclass(frozen=True)
class Quoted:
    text: str  # as normalized for exemptions: commas dropped, "−" as "-"
    value: float
    tolerance: float  # half a unit of the last written digit
    line: int


def quoted_numbers(text: str) -> list[Quoted]:
    out = []
    for lineno, line in enumerate(prose(text).splitlines(), 1):
        for m in _NUMBER.finditer(line):
            sign = "-" if m["sign"] in ("-", "−") else ""
            body, frac, exp = m["body"].replace(",", ""), m["frac"] or "", m["exp"] or ""
            written = f"{sign}{body}{frac}{exp.replace('−', '-')}"
            if m["x"]:  # 1.16.x: a version
                out.append(Quoted(written + ".x", math.nan, 0.0, lineno))
                continue
            if not frac and not exp and len(body) == 1:
                continue  # a single-digit integer
            decimals = len(frac) - 1 if frac else 0
            power = int(exp[1:].replace("−", "-")) if exp else 0
            tolerance = 0.5 * 10.0 ** (power - decimals)
            out.append(Quoted(written, float(written), tolerance, lineno))
    return out


def result_values(patterns: tuple[str, ...]) -> list[float]:
    values = []
    for pattern in patterns:
        for path in sorted(glob.glob(str(ROOT / pattern))):
            for tok in _RESULT_NUMBER.findall(Path(path).read_text()):
                values.append(float(tok.replace(",", "").replace("−", "-")))
    return values


def make_recipe(target: str, makefile: str) -> tuple[list[str], str]:
    """(prerequisites, recipe text) of a Makefile target."""
    m = re.search(rf"^{re.escape(target)}:([^\n=]*)\n((?:\t.*\n?)*)", makefile, re.M)
    if m is None:
        return [], ""
    return m.group(1).split(), m.group(2)


def figure_problem(name: str, image: str, target: str) -> str | None:
    """Why `make figures` would not redraw ``image`` through ``target`` (None: it does)."""
    makefile = (ROOT / "Makefile").read_text()
    if target not in make_recipe("figures", makefile)[0]:
        return f"{name}: {image}: {target} is not a prerequisite of `make figures`"
    recipe = make_recipe(target, makefile)[1]
    texts = [recipe]
    for script in re.findall(r"[\w./-]+\.(?:py|sh)\b", recipe):
        if (ROOT / script).is_file():
            texts.append((ROOT / script).read_text())
    if not any(Path(image).name in t for t in texts):
        return f"{name}: {image}: neither `make {target}` nor a script it runs writes it"
    return None


def check_page(name: str, page: Page, text: str | None = None) -> list[str]:
    """What is wrong with one page: numbers no results file holds, stale exemptions, missing
    results files, images without a figure step."""
    text = (ROOT / name).read_text() if text is None else text
    problems = []
    for pattern in page.results:
        if not glob.glob(str(ROOT / pattern)):
            problems.append(f"{name}: no results file matches {pattern!r}")
    values = sorted(result_values(page.results))
    quoted = quoted_numbers(text)
    for q in quoted:
        if q.text in page.exempt:
            continue
        if math.isnan(q.value) or not any(
            abs(v - q.value) <= q.tolerance * (1 + 1e-9) for v in values
        ):
            problems.append(f"{name}:{q.line}: {q.text} is in no results file of the page")
    written = {q.text for q in quoted}
    for number in page.exempt:
        if number not in written:
            problems.append(f"{name}: exemption {number!r} no longer occurs on the page")
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        if image not in page.figures:
            problems.append(f"{name}: image {image} is drawn by no `make figures` step in PAGES")
        elif (problem := figure_problem(name, image, page.figures[image])) is not None:
            problems.append(problem)
    return problems


def main(argv: list[str]) -> int:
    names = argv or list(PAGES)
    problems = [p for name in names for p in check_page(name, PAGES[name])]
    print("\n".join(problems) or f"doc numbers: {len(names)} page(s) match their results files")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
