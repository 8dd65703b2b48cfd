"""bench_trainer_step.py's real-model mode (``--model``), the parent's side: the cases, one
fresh child per trainer and case (``_trainer_step_real_child``), the comparison of their scoring
passes, and the results files (``_trainer_step_report`` writes the report).

A pretrained model (a name of ``gmpo_tasks.pretrained``, converted offline, or a local model
directory) in three trainers (``--variants``): ``gmpo`` (gmpo_trl's GMPOTrainer with its
defaults, gmpo_core's LM head), ``grpo`` (TRL's GRPOTrainer, its default ``loss_type``) and
``trl_gmpo`` (``trl.experimental.gmpo.GMPOTrainer``), each with gmpo_tasks.chat_chain_sum's
trainer settings, in each case of ``--cases`` (``PRECISION:ROWSxTOKENS[:REPEATS]``; ``bf16`` is
``bf16=True`` with ``use_cpu=True``: accelerate's CPU autocast), each trainer and case in a fresh
child. The batch: chat_chain_sum's prompts through the model's chat template and a fixed reply per
prompt, the same in every child of a case; the same initial weights. The timed step: the old
log-probs (GRPOTrainer's no-grad scoring pass, as with ``num_iterations`` > 1), ``compute_loss``,
backward, gradient clipping and the trainer's AdamW step; ``--warmup`` steps first (the first
under a dispatch mode that counts which GEMMs ran in which dtype), then ``--repeats`` timed ones.
Per step: the process's CPU time (one torch thread by default: the step's own work, which other
processes on a shared machine do not inflate; two threads on two busy cores were several
times slower by the wall clock) and the wall time, per phase too; the LM head's time (TRL's
``ChunkedLogProbFunction`` or gmpo_core's ``token_logprobs``: each call timed, its backward
between hooks on its autograd node); peak RSS (VmHWM, as in the toy mode, absolute and over the RSS
before the step). The first warmup step's scoring pass is compared across the children.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from _common import REPO, RESULTS, cpu_flags, cpu_model, dist_version, loadavg, run_meta
from _trainer_step_real_child import PRECISIONS, REAL_VARIANTS
from _trainer_step_report import real_markdown, real_summary

#: where the real-model mode writes: trainer_step_real_<tag>.md/.json
REAL_RESULTS_DIR = RESULTS / "figures-bench"
#: the real-model mode's cases, PRECISION:ROWSxTOKENS[:REPEATS]: the chat tasks' step (16 rows,
#: 8 generations of 2 prompts, 32 completion tokens) in float32 and in bf16, bf16 with 2 timed
#: steps: on a CPU without bf16 instructions (AVX2 only) its GEMMs run several times slower
REAL_CASES = "float32:16x32,bf16:16x32:2"
REAL_QUICK_CASES = "float32:2x4"
REAL_GENERATIONS = 8  # the chat tasks' group (gmpo_tasks.chat.RealCell)


def parse_cases(text: str, generations: int, repeats: int) -> list[dict[str, Any]]:
    """``PRECISION:ROWSxTOKENS[:REPEATS],...`` -> the cases: precision, rows, generations per
    prompt (the chat tasks' group, or every row where fewer), completion tokens and timed steps
    (``repeats`` where not given)."""
    cases = []
    for item in text.split(","):
        precision, _, rest = item.strip().partition(":")
        shape, _, reps = rest.partition(":")
        rows, _, tokens = shape.partition("x")
        if (
            precision not in PRECISIONS
            or not (rows.isdigit() and tokens.isdigit())
            or not (reps.isdigit() or not reps)
        ):
            raise ValueError(
                f"a case is PRECISION:ROWSxTOKENS[:REPEATS], PRECISION in {PRECISIONS}: {item!r}"
            )
        group = min(generations, int(rows))
        if int(rows) % group or group < 2:
            raise ValueError(f"{item!r}: rows must be a multiple of {group} (and at least 2)")
        cases.append(
            {
                "precision": precision,
                "rows": int(rows),
                "generations": group,
                "tokens": int(tokens),
                "repeats": int(reps) if reps else repeats,
                "key": f"{precision}:{rows}x{tokens}",
            }
        )
    return cases


def run_real_child(
    variant: str, case: dict[str, Any], args: argparse.Namespace, save: str, how: dict[str, Any]
) -> dict[str, Any]:
    """``variant`` in ``case``, in a fresh child (``how``: the script, its child env and the
    mark of its result line)."""
    options = {
        "--model": args.model,
        "--_child": variant,
        "--_save": save,
        "--_precision": case["precision"],
        "--batch": case["rows"],
        "--generations": case["generations"],
        "--completion": case["tokens"],
        "--threads": args.threads,
        "--repeats": case["repeats"],
        "--warmup": args.warmup,
        "--seed": args.seed,
    }
    cmd = [sys.executable, how["script"], *(str(x) for kv in options.items() for x in kv)]
    env = {**os.environ, **how["child_env"], "HF_HUB_OFFLINE": "1"}  # a local model: no hub
    load = loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    marked = [ln for ln in proc.stdout.splitlines() if ln.startswith(how["mark"])]
    if proc.returncode != 0 or not marked:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{variant} {case['key']} child failed (exit {proc.returncode}): {tail}")
    result: dict[str, Any] = json.loads(marked[-1][len(how["mark"]) :])
    result.update(child_wall_s=time.perf_counter() - t0, load_start=load, load_end=loadavg())
    return result


def compare_real(
    saved: dict[tuple[str, str], str], cases: list[dict[str, Any]], variants: list[str]
) -> dict[str, Any]:
    """The first warmup step's scoring pass (the initial weights, the same batch in every child):
    each trainer against gmpo in each case, and bf16 against float32 for each trainer where
    both ran at one shape; max |Δ| over the valid completion tokens."""
    import torch

    def load(key: str, v: str) -> dict[str, Any]:
        return torch.load(saved[(key, v)])  # type: ignore[no-any-return]

    out: dict[str, Any] = {"against_gmpo": {}, "bf16_against_float32": {}, "warmup_loss": {}}
    for case in cases:
        key = case["key"]
        for v in variants:
            out["warmup_loss"].setdefault(key, {})[v] = float(load(key, v)["loss"])
        if "gmpo" in variants:
            ref = load(key, "gmpo")
            mask = ref["mask"].bool()
            for v in variants:
                if v != "gmpo":
                    d = (load(key, v)["old_logps"] - ref["old_logps"])[mask].abs().max()
                    out["against_gmpo"].setdefault(key, {})[v] = float(d)
        if case["precision"] == "bf16":
            f32 = f"float32:{case['rows']}x{case['tokens']}"
            if any(c["key"] == f32 for c in cases):
                for v in variants:
                    a, b = load(key, v), load(f32, v)
                    d = (a["old_logps"] - b["old_logps"])[a["mask"].bool()].abs()
                    out["bf16_against_float32"].setdefault(key, {})[v] = {
                        "max_abs": float(d.max()),
                        "mean_abs": float(d.mean()),
                    }
    return out


#: the CPU flags that decide how fast bf16 GEMMs run on a CPU
BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def git_state() -> dict[str, Any]:
    """The checkout's commit, and the code paths that differ from it."""

    def git(*a: str) -> str:
        proc = subprocess.run(["git", *a], capture_output=True, text=True, cwd=REPO)
        return proc.stdout.rstrip("\n") if proc.returncode == 0 else "unknown"

    paths = ("benchmarks", "gmpo_core", "adapters", "gmpo_tasks")
    dirty = git("status", "--porcelain", "--", *paths)
    return {
        "commit": git("rev-parse", "HEAD"),
        "commit_short": git("rev-parse", "--short", "HEAD"),
        "uncommitted_code": [ln[3:] for ln in dirty.splitlines()] if dirty != "unknown" else [],
    }


def real_main(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    p: argparse.ArgumentParser,
    how: dict[str, Any],
) -> int:
    """``--model``: each trainer and case in a fresh child (``how``: ``script``, the benchmark
    that runs them; ``child_env``; ``mark``, its result line's prefix); the table; the results
    files."""
    if args.quick:
        args.no_write = True
        args.repeats = min(args.repeats, 1)
    try:
        cases = parse_cases(
            args.cases or (REAL_QUICK_CASES if args.quick else REAL_CASES),
            args.generations or REAL_GENERATIONS,
            args.repeats,
        )
    except ValueError as e:
        p.error(str(e))
    from gmpo_tasks import pretrained

    if args.model not in pretrained.MODELS and not os.path.isdir(args.model):
        p.error(
            f"--model {args.model!r}: neither a local directory nor one of "
            f"{sorted(pretrained.MODELS)} (gmpo_tasks.pretrained)"
        )
    variants = [v for v in (args.variants or ",".join(REAL_VARIANTS)).split(",") if v]
    for v in variants:
        if v not in REAL_VARIANTS:
            p.error(f"unknown variant {v!r} with --model; choose from {REAL_VARIANTS}")
    trl_version = dist_version("trl") or "not installed"
    load_start = loadavg()
    started = {**run_meta(how["script"], argv, trl_version), **git_state()}
    print(
        f"# {args.model}: {', '.join(c['key'] for c in cases)}; {', '.join(variants)}; "
        f"{args.threads} thread(s), {cpu_model()}, load {load_start}",
        flush=True,
    )
    t_all = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        saved = {
            (c["key"], v): os.path.join(tmp, f"{c['key'].replace(':', '_')}_{v}.pt")
            for c in cases
            for v in variants
        }
        for case in cases:
            for v in variants:
                r = run_real_child(v, case, args, saved[(case["key"], v)], how)
                results.setdefault(case["key"], {})[v] = r
                st = r["step"]
                print(
                    f"{case['key']:>14} {v:>8}: CPU s/step "
                    f"{[round(s, 2) for s in st['cpu_seconds']]}"
                    f", wall {[round(s, 2) for s in st['wall_seconds']]}, head CPU s "
                    f"{[round(sum(h.values()), 2) for h in st['head_cpu_seconds']]}, "
                    f"peak RSS MB {[round(b / 1e6) for b in st['peak_rss_bytes']]} "
                    f"({r['child_wall_s']:.0f} s, load {r['load_start']} -> {r['load_end']})",
                    flush=True,
                )
        agreement = compare_real(saved, cases, variants)
    wall = time.perf_counter() - t_all
    load_end = loadavg()
    summary = real_summary(results)
    meta = {
        **started,  # the command, the date, the commit and the code's state at the start
        "finished_utc": run_meta(how["script"], argv, trl_version)["date_utc"],
        "commit_at_end": git_state(),  # where other work committed in the checkout meanwhile
        "transformers": dist_version("transformers") or "not installed",
        "accelerate": dist_version("accelerate") or "not installed",
        "gmpo": dist_version("gmpo") or "not installed",
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_flags": {"checked": list(BF16_FLAGS), "present": cpu_flags(BF16_FLAGS)},
        "threads": args.threads,
        "load_average_start": load_start,
        "load_average_end": load_end,
        "child_env": how["child_env"],
        "model": args.model,
        "cases": cases,
        "variants": variants,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seed": args.seed,
        "wall_s": wall,
    }
    text = real_markdown(meta, results, summary, agreement)
    print()
    print(text)
    print(f"total {wall:.0f} s")
    if args.no_write:
        return 0
    REAL_RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = REAL_RESULTS_DIR / f"trainer_step_real_{args.tag}"
    stem.with_suffix(".json").write_text(
        json.dumps(
            {"meta": meta, "results": results, "summary": summary, "agreement": agreement}, indent=1
        )
        + "\n"
    )
    stem.with_suffix(".md").write_text(text)
    print(f"wrote {stem.relative_to(REPO)}.md/.json")
    return 0
