"""Every measured number in the checked docs pages comes from a results file.

``make figures`` regenerates the results files (``results/``, ``benchmarks/results/``) and the
figures (``docs/img/``); the pages quote them. This script reads each page registered in
``PAGES``, takes every number in its prose and tables, and reports the ones that no number in
the page's results files rounds to (at the precision the page writes: ``0.72`` matches
``0.7197``, not ``0.74``). ``tests/test_doc_numbers.py`` fails on any report.

Not numbers, on every page: fenced code blocks and inline code (commands, options, identifiers),
link targets, dates (2026-11-29) and times (20:56), dotted versions (2.13.0), single-digit
integers (counts of settings: "2 threads", "8 generations"; a measured quantity is written with
its unit or decimals), and digits inside words (Qwen2, bf16, H200, 1.5B).

Anything else that is not a measured number (a hyper-parameter, a size, a version written as
``trl 1.16``, a figure from the paper with its source) is exempted *per page* in ``PAGES`` with
the reason, so that a review sees each one. An exemption that no longer occurs on its page is
reported too.

To check a new page: add ``"path/to/page.md": Page(results=(globs...), exempt={...},
figures={...})``, run ``python scripts/doc_numbers.py path/to/page.md``, and for each number
reported either point the page at the results file that holds it, regenerate it, or exempt it
with a reason.

    python scripts/doc_numbers.py            # every registered page; exit 1 on any report
    python scripts/doc_numbers.py README.md  # one page
"""

from __future__ import annotations

import glob
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


# The Markdown results only: the JSON beside each holds every repeat, and the more numbers a
# page is compared with, the likelier a wrong number matches one by chance.
_TRL_RESULTS = ("results/*.md",)
_LM_HEAD_RESULTS = (
    "benchmarks/results/lm_head_cpu.md",
    "benchmarks/results/lm_head_cpu_entropy.md",
    "benchmarks/results/trainer_step_cpu.md",
)

PAGES: dict[str, Page] = {
    "README.md": Page(
        results=_TRL_RESULTS,
        exempt={
            "0.4": "hyper-parameter: GMPO's clip epsilon (exp(±0.4))",
            "0.2": "hyper-parameter: GRPO's clip epsilon (1 ± 0.2)",
            "2507.20673": "the paper's arXiv id",
            "2026": "the paper's venue (ICLR 2026)",
            "3.10": "the minimum Python (pyproject.toml's requires-python)",
            "1.10": "the minimum TRL (pyproject.toml's trl>=1.10)",
            "1.16": "the TRL release whose chunked LM head gmpo_lm_head replaces",
        },
    ),
    "docs/install.md": Page(
        results=("results/compat.md",),
        exempt={
            "3.10": "the minimum Python (pyproject.toml's requires-python)",
            "2.4": "the minimum torch (pyproject.toml's torch>=2.4)",
            "1.24": "the minimum numpy (pyproject.toml's numpy>=1.24)",
            "1.10": "the minimum TRL (pyproject.toml's trl>=1.10)",
            "0.8": "the minimum verl (pyproject.toml's verl>=0.8), and torch 2.4.0's wheel in GB",
            "1.16": "a TRL release, where its behaviour changed",
            "0.9": "a verl release series, where its behaviour changed",
            "0.7": "a verl release series that is not supported",
            "5.11": "verl 0.9.1's transformers cap (transformers<5.11)",
            "2.13": "a torch release series (clamp's gradient at a tie is 1 up to it)",
            "2.14": "the torch release series that changed clamp's gradient at a tie",
            "0.5": "torch 2.14.1's clamp gradient at a tie (a property of torch; tests/test_compat.py checks that gmpo's is 1)",
            "24": "a pyarrow release (pyarrow<24)",
            "5.2": "a datasets release (datasets>=5.2 requires pyarrow>=24)",
        },
    ),
    "docs/trl.md": Page(
        results=(*_TRL_RESULTS, *_LM_HEAD_RESULTS),
        exempt={
            "0.4": "hyper-parameter: GMPO's clip epsilon",
            "-0.22": "GRPO's clip range in log space, log(1 - 0.2), from its epsilon",
            "0.18": "GRPO's clip range in log space, log(1 + 0.2), from its epsilon",
            "1.16": "the tested TRL release",
            "1.10": "the minimum TRL (pyproject.toml's trl>=1.10)",
            "3.0": "TRL's default vllm_importance_sampling_cap",
            "16": "the reverse task: digits, prompts a generation, optimizer steps a generation",
            "100": "a setting: generations of a --task reverse run",
            "2e-3": "hyper-parameter: the --task reverse run's learning rate",
            "40": "the collapse columns' minimum of logged rewards (2 x 20)",
            "20": "the collapse rule's window (logged rewards)",
            "0.3": "the collapse rule's drop",
        },
        figures={"img/trl_train.png": "figures-trl", "img/trl_compare.png": "figures-trl"},
    ),
    "docs/lm_head.md": Page(
        results=_LM_HEAD_RESULTS,
        exempt={
            "156": "computed: the (256, V) float32 tile, 256 x 151,936 x 4 bytes",
            "545": "computed: the float32 weight gradient, V x H x 4 bytes at H = 896",
            "78": "computed: the tile's growth per 128 tokens, 128 x V x 4 bytes",
            "8192": "a constant of the implementation: weight rows upcast at a time",
            "32768": "a setting: TRL's vocabulary chunk as GRPOTrainer calls its head",
        },
        figures={
            "img/lm_head_memory.png": "figures-lm-head",
            "img/lm_head_time.png": "figures-lm-head",
        },
    ),
    "docs/verl.md": Page(
        results=("results/verl_cpu.md",),
        exempt={
            "0.9": "the tested verl release series (verl >= 0.9, the 0.9 engine)",
            "0.2": "hyper-parameter: verl's default clip_ratio",
            "0.4": "hyper-parameter: GMPO's clip epsilon (the paper's)",
            "3.0": "verl's default clip_ratio_c",
            "10": "a constant of verl: its low_var_kl clamp (±10)",
            "1e-10": "a constant of verl's geo_mean: log(1e-10) for a zero rollout weight",
            "1.x": "trl's release series",
            "1e-5": "a threshold of tests/verl/test_main_ppo.py (rollout vs actor probabilities)",
            "0.02": "hyper-parameter: the CPU runs' learning rate (examples/verl/cpu/e2e.py)",
        },
    ),
    "docs/study.md": Page(
        # the sweep, the GMPO variants, and the same task through TRL's trainer
        # (make figures-study-trl)
        results=(
            "results/study/summary.md",
            "results/study/variants/summary.md",
            "results/study/trl_reverse*.md",
        ),
        exempt={
            "16": "the task: digits per prompt, vocabulary size, prompts a step, updates a step",
            "64": "the model's width; demonstrations per warm-start step",
            "400": "a setting: warm-start steps",
            "3e-3": "hyper-parameter: the warm start's learning rate",
            "0.1": "the task: a demonstration digit's replacement probability",
            "0.91": "computed from the noise: 0.9 + 0.1 / 10",
            "0.22": "computed: 0.91^16, the warm start's expected reward",
            "100": "a setting: RL steps per run",
            "2507.20673": "the paper's arXiv id",
            "240": "the full grid's run count: 6 methods x 4 learning rates x 2 x 5 seeds",
            "1.0": "hyper-parameter: the gradient-clipping norm",
            "0.2": "hyper-parameter: GRPO's clip epsilon (1 ± 0.2); GMPO's narrow epsilon",
            "-0.4": "hyper-parameter: the wide ratio range e^-0.4",
            "0.4": "hyper-parameter: GMPO's clip epsilon (the paper's)",
            "20": "the collapse rule's window (steps)",
            "0.3": "the collapse rule's drop",
            "0.05": "the sign tests' level, fixed in advance",
            "0.025": "the sign tests' level for both at once (0.05 / 2)",
        },
        figures={
            "img/study_stability.png": "figures-study",
            "img/study_trl_reverse.png": "figures-study-trl",
            "img/study_trl_reverse_lr1e-3.png": "figures-study-trl",
        },
    ),
    "docs/benchmarks.md": Page(
        results=("benchmarks/results/loss_cpu.md", "benchmarks/results/packed_cpu.md"),
        exempt={
            "0.4": "hyper-parameter: GMPO's clip epsilon (the paper's)",
            "32": "a setting: glibc's mmap threshold in MiB",
            "30": "a setting: timed calls per shape",
            "200": "a setting: calls of the break-even loop",
            "50": "a setting: the break-even loop's shortest T",
            "199": "a setting: the break-even loop's calls after the first",
            "20": "the inputs: about 20 % of rows run to T",
        },
    ),
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
