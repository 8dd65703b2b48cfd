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

Counts of verdicts written in words ("27 of 32 primary rows *same*", "5 *inconclusive*", "none
*hurts*") are checked too, on a page whose entry names an analysis output under ``"verdicts"``:
``{"results/updates/updates.json": "primary"}`` counts the ``verdict`` of each row of that JSON
file's ``primary`` family, and every count the page writes before a verdict word (and every total
of rows it names beside one) must equal it; such a page must state at least one count. A quote of
an old, wrong text (an erratum's) goes in inline code, which neither check reads.

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
    #: an analysis output (a JSON file) -> the family of rows whose verdicts the page counts
    verdicts: dict[str, str] = field(default_factory=dict)


# The registered pages: their results files (the Markdown results only: the JSON beside each
# holds every repeat, and the more numbers a page is compared with, the likelier a wrong number
# matches one by chance), their exemptions with the reason for each, and their figures.
PAGES: dict[str, Page] = {
    name: Page(
        results=tuple(entry["results"]),
        exempt=entry.get("exempt", {}),
        figures=entry.get("figures", {}),
        verdicts=entry.get("verdicts", {}),
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


VERDICTS = ("same", "inconclusive", "helps", "hurts")
_WORD_COUNTS = {"none": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
                "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}  # fmt: skip
# a count before a verdict word: "28 are *same*", "4 inconclusive", "none *hurts*", "27 of 32
# primary rows *same*", "28 of its 32 comparisons are the same"
_COUNT_CLAIM = re.compile(
    r"(?<![\w.])(?P<n>\d+|" + "|".join(_WORD_COUNTS) + r")\s+"
    r"(?:of\s+(?:the\s+|its\s+)?(?P<total>\d+)\s+(?:primary\s+)?(?:rows|comparisons)\s+)?"
    r"(?:(?:are|is|rows?)\s+)?(?:the\s+)?\*?(?P<verdict>" + "|".join(VERDICTS) + r")\*?(?![\w])",
    re.I,
)
# a total of rows named without a count: "Of the 32 primary rows, ..."
_ROW_TOTAL = re.compile(
    r"\bof\s+(?:the|its)\s+(?P<total>\d+)\s+primary\s+(?:rows|comparisons)\b", re.I
)


@dataclass(frozen=True)
class Claim:
    verdict: str | None  # None: a total of rows
    count: int
    line: int


def verdict_claims(text: str) -> list[Claim]:
    """The counts of verdicts (and totals of rows) a page writes in its prose (see the module
    docstring; inline code, where an erratum quotes an old text, is not read)."""
    body = prose(text)
    claims = []

    def line_of(pos: int) -> int:
        return body.count("\n", 0, pos) + 1

    for m in _COUNT_CLAIM.finditer(body):
        n = m["n"].lower()
        count = _WORD_COUNTS[n] if n in _WORD_COUNTS else int(n)
        claims.append(Claim(m["verdict"].lower(), count, line_of(m.start())))
        if m["total"]:
            claims.append(Claim(None, int(m["total"]), line_of(m.start("total"))))
    for m in _ROW_TOTAL.finditer(body):
        claims.append(Claim(None, int(m["total"]), line_of(m.start())))
    return sorted(claims, key=lambda c: c.line)


def verdict_counts(path: str, family: str) -> dict[str | None, int]:
    """Rows per verdict in ``family`` of the analysis output ``path`` (key None: all rows)."""
    rows = json.loads((ROOT / path).read_text())[family].values()
    counts: dict[str | None, int] = {v: 0 for v in VERDICTS}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    counts[None] = len(rows)
    return counts


def verdict_problems(name: str, page: Page, text: str) -> list[str]:
    """Each count of verdicts the page writes that its analysis output does not hold."""
    problems = []
    claims = verdict_claims(text)
    for path, family in page.verdicts.items():
        if not (ROOT / path).is_file():
            problems.append(f"{name}: no analysis output {path!r}")
            continue
        if not claims:
            problems.append(f"{name}: states no count of {path!r}'s {family} verdicts")
        counts = verdict_counts(path, family)
        for c in claims:
            if counts.get(c.verdict, 0) != c.count:
                what = f"{c.verdict} rows" if c.verdict else "rows in all"
                problems.append(
                    f"{name}:{c.line}: {c.count} {what}, but {path}'s {family} family has "
                    f"{counts.get(c.verdict, 0)}"
                )
    return problems


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
    results files, images without a figure step, counts of verdicts the analysis does not hold."""
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
    problems += verdict_problems(name, page, text)
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
