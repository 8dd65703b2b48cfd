"""``GMPOConfig(gmpo_lm_head=True)`` against TRL's own LM head, inside a real GMPOTrainer step.

Run from the repository root::

    python benchmarks/bench_trainer_step.py           # V = 151,936, N ≈ 3,100 tokens (~6 min)
    python benchmarks/bench_trainer_step.py --quick   # tiny V and N (< 60 s, CI), writes nothing

The model makes the LM head matter: a Qwen2 (``Qwen2ForCausalLM`` from a ``Qwen2Config``, random
weights, tied embeddings as in Qwen2.5-0.5B) with a small body (``--hidden`` 128, ``--layers`` 2)
and Qwen's vocabulary size (``--vocab`` 151,936). The tokenizer is the project's character
tokenizer (``gmpo_tasks.chars``) with its vocabulary padded by dummy tokens up to V, so that every
sampled id decodes. Nothing is downloaded.

Two variants, each in its own FRESH subprocess (``--variants``):

* ``trl``: ``GMPOConfig(gmpo_lm_head=False)`` (the default): TRL 1.16's patched forward scores
  tokens with ``trl.kernels.ChunkedLogProbFunction``.
* ``gmpo``: ``GMPOConfig(gmpo_lm_head=True)``: the same forward with
  ``gmpo_core.lm_head.token_logprobs`` in that place (``gmpo_trl.head_swap``).

Everything else is identical: same seed, same initial weights, same batch, same loss
(``--gmpo-impl``, default ``plain``, for both; the loss is milliseconds against the head's
seconds). On CPU TRL's forward scores every position of every row (B·(P + T − 1) tokens, prompt
and padding included, labels clamped), and it hands the same tokens to either head.

What is timed, in each child, with ``torch.set_num_threads(--threads)`` (default 1):

1. **loss step** (the part the switch affects; generation excluded): on a fixed prepared batch
   (seeded: B = ``--batch`` rows, a P = 2-token prompt and T = ``--completion`` completion
   tokens of random ids, all valid, as the trainer's own sampling yields them from this random
   model; one N(0, 1) advantage per row; ``old_per_token_logps`` = −ln V + N(0, 0.2), near this
   random model's own log-probs, so that the clip acts and the loss value depends on the head's
   log-probs; the head's work is the same with or without them), ``model.zero_grad(set_to_none=True)``, then
   ``loss = trainer.compute_loss(model, batch)`` (GMPOTrainer's ``_compute_loss``: the scoring
   forward with entropies, the GMPO loss, the metrics) and ``trainer.accelerator.backward(loss)``.
   ``--warmup`` untimed steps first, then ``--repeats`` timed ones; the table gives the median.
   The loss and the gradient of every parameter from the first timed step are saved, and the
   parent compares the two variants on them (same batch, same weights: apples to apples), and
   on the per-token log-probs and entropies that step's scoring pass returned.
2. **train step** (``--train-repeats``, 0 to skip): ``trainer.train()`` for 1 + that many
   optimizer steps; a callback times each step after the first from ``on_step_begin`` to
   ``on_step_end``: generation by the trainer itself (``transformers`` ``generate`` on CPU, B
   completions of up to T tokens, ``--batch`` / ``--generations`` prompts), rewards (a
   deterministic hash of the completion text), advantages, the loss step, gradient clipping and
   the AdamW step. Generation does not use the head that the switch changes. The first step is
   the warmup (optimizer state is created there).

Peak extra memory: before each timed step (either kind), ``gc.collect()``, ``malloc_trim(0)``,
``echo 5 > /proc/self/clear_refs`` (VmHWM := VmRSS), read VmRSS; after it read VmHWM; extra =
VmHWM − VmRSS: everything the step allocated, parameter gradients included, weights, batch and
optimizer state excluded. The children run with ``MALLOC_MMAP_THRESHOLD_=131072`` (as in
``bench_loss.py``), so that buffers of 128 KiB and more are unmapped when freed and the resident
set follows live memory; times are taken in the same children. The table gives the largest peak
over the timed steps.

Real-model mode (``--model``; ``results/figures-bench/trainer_step_real_<tag>.md/.json``)::

    python benchmarks/bench_trainer_step.py --model smollm2-135m           # about 1 h on one core
    python benchmarks/bench_trainer_step.py --model smollm2-135m --quick   # 2 rows x 4 tokens

Three trainers (gmpo_trl's, TRL's GRPOTrainer and trl.experimental.gmpo's) on a pretrained model,
float32 and bf16 autocast, whole steps: ``_trainer_step_real.py`` says what is measured and how.
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
from pathlib import Path
from typing import Any

from _common import (
    MALLOC_ENV,
    REPO,
    RESULTS,
    cpu_model,
    dist_version,
    loadavg,
    run_meta,
)
from _trainer_step_child import PROMPT_LEN, child
from _trainer_step_real import REAL_CASES, REAL_QUICK_CASES, real_main
from _trainer_step_real_child import PRECISIONS, REAL_VARIANTS, real_child
from _trainer_step_report import summarize, table, verdict

#: where this benchmark writes (``make figures-lm-head``)
RESULTS_DIR = RESULTS / "figures-lm-head"

VARIANTS = ("trl", "gmpo")
# bench_loss's malloc setting (see _common.MEMORY_RESOLUTION_BYTES); one thread for the
# tokenizer's Rust pool too.
CHILD_ENV = {**MALLOC_ENV, "TOKENIZERS_PARALLELISM": "false"}
RESULT_MARK = "BENCH_RESULT "
DEFAULTS = dict(vocab=151_936, hidden=128, layers=2, batch=16, generations=8, completion=192)
QUICK = dict(vocab=4096, hidden=32, layers=1, batch=4, generations=2, completion=16)


# --------------------------------------------------------------------------------------------
# parent: children, comparison, table, files


def run_child(variant: str, args: argparse.Namespace, save: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", variant, "--_save", save]
    for key in ("vocab", "hidden", "layers", "batch", "generations", "completion", "threads"):
        cmd += [f"--{key}", str(getattr(args, key))]
    cmd += ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    cmd += ["--train-repeats", str(args.train_repeats), "--gmpo-impl", args.gmpo_impl]
    cmd += ["--seed", str(args.seed)]
    env = {**os.environ, **CHILD_ENV}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    marked = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not marked:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{variant} child failed (exit {proc.returncode}): {tail}")
    result: dict[str, Any] = json.loads(marked[-1][len(RESULT_MARK) :])
    result["child_wall_s"] = time.perf_counter() - t0
    return result


def compare(saved: dict[str, str]) -> dict[str, float]:
    """The gmpo variant against the TRL variant on the same batch and weights."""
    import torch

    ref, got = torch.load(saved["trl"]), torch.load(saved["gmpo"])
    loss_ref, loss_got = ref["loss"].double(), got["loss"].double()
    g_ref, g_got = ref["grad"].double(), got["grad"].double()

    def rel(key: str) -> float:
        a, b = ref[key].double(), got[key].double()
        return float((b - a).abs().max() / a.abs().max().clamp(min=1e-30))

    return {
        "logps_max_abs_diff_over_max_abs": rel("logps"),
        "entropies_max_abs_diff_over_max_abs": rel("entropies"),
        "loss_trl": float(loss_ref),
        "loss_gmpo": float(loss_got),
        "loss_rel_diff": float((loss_got - loss_ref).abs() / loss_ref.abs().clamp(min=1e-30)),
        "grad_max_abs_diff_over_max_abs": float(
            (g_got - g_ref).abs().max() / g_ref.abs().max().clamp(min=1e-30)
        ),
        "grad_norm_rel_diff": float((g_got - g_ref).norm() / g_ref.norm().clamp(min=1e-30)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny V and N (< 60 s); writes nothing")
    p.add_argument("--vocab", type=int, default=None, help=f"V (default {DEFAULTS['vocab']})")
    p.add_argument("--hidden", type=int, default=None, help=f"H (default {DEFAULTS['hidden']})")
    p.add_argument("--layers", type=int, default=None, help=f"default {DEFAULTS['layers']}")
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help=f"B, per_device_train_batch_size ({DEFAULTS['batch']})",
    )
    p.add_argument(
        "--generations", type=int, default=None, help=f"num_generations ({DEFAULTS['generations']})"
    )
    p.add_argument(
        "--completion",
        type=int,
        default=None,
        help=f"T, max_completion_length ({DEFAULTS['completion']})",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed loss steps per variant")
    p.add_argument("--warmup", type=int, default=1, help="untimed loss steps first")
    p.add_argument(
        "--train-repeats", type=int, default=2, help="timed train steps after a warmup (0: none)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads in the children",
    )
    p.add_argument("--gmpo-impl", default="plain", help="GMPOConfig.gmpo_impl, both variants")
    p.add_argument(
        "--variants",
        default=None,
        help=f"default {','.join(VARIANTS)}; with --model {','.join(REAL_VARIANTS)}",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument(
        "--tag",
        default="cpu",
        help="results: trainer_step_<tag>.md/.json (--model: trainer_step_real_<tag>)",
    )
    real = p.add_argument_group(
        "real-model mode (--model): gmpo_trl's GMPOTrainer, TRL's GRPOTrainer and "
        "trl.experimental.gmpo's GMPOTrainer, whole steps of a pretrained model"
    )
    real.add_argument(
        "--model",
        help="a name of gmpo_tasks.pretrained (smollm2-135m) or a local model directory",
    )
    real.add_argument(
        "--cases",
        default=None,
        help=f"PRECISION:ROWSxTOKENS[:REPEATS],... (default {REAL_CASES}; --quick "
        f"{REAL_QUICK_CASES}); REPEATS: timed steps (default --repeats)",
    )
    p.add_argument("--_child", choices=sorted({*VARIANTS, *REAL_VARIANTS}), help=argparse.SUPPRESS)
    p.add_argument("--_save", help=argparse.SUPPRESS)
    p.add_argument("--_precision", choices=PRECISIONS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads is None:
        args.threads = 1
    if args.model:
        if args._child:
            args.variant, args.save, args.precision = args._child, args._save, args._precision
            print(RESULT_MARK + json.dumps(real_child(args)), flush=True)
            return 0
        how = {"script": str(Path(__file__).resolve()), "child_env": CHILD_ENV, "mark": RESULT_MARK}
        return real_main(args, argv, p, how)
    sizes = QUICK if args.quick else DEFAULTS
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    if args._child:
        args.variant, args.save = args._child, args._save
        print(RESULT_MARK + json.dumps(child(args)), flush=True)
        return 0

    if args.quick:
        args.no_write = True
        args.repeats = min(args.repeats, 2)
    variants = [v for v in (args.variants or ",".join(VARIANTS)).split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; choose from {VARIANTS}")
    trl_version = dist_version("trl") or "not installed"
    labels = {
        "trl": f"TRL {trl_version} (gmpo_lm_head=False)",
        "gmpo": "gmpo token_logprobs (gmpo_lm_head=True)",
    }
    tokens = args.batch * (PROMPT_LEN + args.completion - 1)
    results: dict[str, dict[str, Any]] = {}
    load_start = loadavg()
    print(
        f"# V = {args.vocab}, H = {args.hidden}, {args.layers} layer(s), B = {args.batch}, "
        f"T = {args.completion}, P = {PROMPT_LEN}: {tokens} tokens scored per step; "
        f"{args.threads} thread(s), {cpu_model()}, load {load_start}",
        flush=True,
    )
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        saved = {v: os.path.join(tmp, f"{v}.pt") for v in variants}
        for v in variants:
            r = run_child(v, args, saved[v])
            results[v] = r
            ls = r["loss_step"]
            print(
                f"{v:>5}: loss step ms {[round(s * 1e3) for s in ls['seconds']]}, peak extra MB "
                f"{[round(b / 1e6) for b in ls['peak_extra_bytes']]}"
                + (
                    f"; train step ms {[round(s * 1e3) for s in r['train_step']['seconds']]}, "
                    f"peak extra MB {[round(b / 1e6) for b in r['train_step']['peak_extra_bytes']]}"
                    if "train_step" in r
                    else ""
                )
                + f" ({r['child_wall_s']:.0f} s)",
                flush=True,
            )
        agreement = compare(saved) if set(VARIANTS) <= set(variants) else {}
    wall = time.perf_counter() - t_all
    load_end = loadavg()
    summary = summarize(results)
    text = table(summary, labels)
    checks = verdict(summary)
    print()
    print(text)
    print()
    if agreement:
        print(
            f"loss: TRL head {agreement['loss_trl']:.9g}, gmpo head {agreement['loss_gmpo']:.9g}, "
            f"relative difference {agreement['loss_rel_diff']:.2e}; gradient (all parameters): "
            f"max |Δ| / max |g| {agreement['grad_max_abs_diff_over_max_abs']:.2e}, "
            f"‖Δ‖ / ‖g‖ {agreement['grad_norm_rel_diff']:.2e}"
        )
        print(
            "per-token log-probs / entropies of the scoring pass: max |Δ| / max |x| "
            f"{agreement['logps_max_abs_diff_over_max_abs']:.2e} / "
            f"{agreement['entropies_max_abs_diff_over_max_abs']:.2e}"
        )
    if checks:
        print("verdict:", json.dumps(checks))
    print(f"total {wall:.0f} s")
    # the two heads must compute the same step, or the comparison means nothing (float32, 1e-5)
    disagree = (
        agreement
        and max(agreement["loss_rel_diff"], agreement["grad_max_abs_diff_over_max_abs"]) > 1e-5
    )
    if disagree:
        print("ERROR: the two LM heads disagree beyond 1e-5 (see above); nothing written")
        return 1
    if args.no_write:
        return 0

    meta = {
        **run_meta(__file__, argv, trl_version),
        "transformers": dist_version("transformers") or "not installed",
        "gmpo": dist_version("gmpo") or "not installed",
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "threads": args.threads,
        "load_average_start": load_start,
        "load_average_end": load_end,
        "child_env": CHILD_ENV,
        "model": f"Qwen2ForCausalLM, hidden {args.hidden}, {args.layers} layer(s), "
        f"intermediate {2 * args.hidden}, 4 heads (2 KV), tied embeddings, float32",
        "vocab": args.vocab,
        "hidden": args.hidden,
        "layers": args.layers,
        "batch": args.batch,
        "num_generations": args.generations,
        "prompt_len": PROMPT_LEN,
        "max_completion_length": args.completion,
        "tokens_scored_per_step": tokens,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "train_repeats": args.train_repeats,
        "gmpo_impl": args.gmpo_impl,
        "wall_s": wall,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = RESULTS_DIR / f"trainer_step_{args.tag}"
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                "meta": meta,
                "results": results,
                "summary": summary,
                "agreement": agreement,
                "verdict": checks,
            },
            indent=1,
        )
        + "\n"
    )
    md = [
        f"# GMPOTrainer step: gmpo_lm_head=True against TRL's head ({meta['date_utc']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"torch {meta['torch']}, trl {trl_version}, transformers {meta['transformers']}, "
        f"{args.threads} thread(s), {meta['cpu']}, Python {meta['python']}; load average "
        f"{load_start} at start, {load_end} at end.  ",
        f"{meta['model']}, V = {args.vocab}; B = {args.batch} rows ({args.generations} "
        f"generations per prompt), P = {PROMPT_LEN} prompt tokens, T = {args.completion} "
        f"completion tokens: {tokens} tokens scored per step (every position, as TRL does on "
        f"CPU). gmpo_impl = {args.gmpo_impl} in both variants.",
        "",
        f"Loss step: `trainer.compute_loss` + backward on a fixed batch, median of "
        f"{args.repeats} after {args.warmup} warmup. Train step: one whole `trainer.train()` "
        f"optimizer step (generation, rewards, loss step, AdamW) after a warmup step, "
        f"{args.train_repeats} timed. Peak extra: VmHWM of a fresh subprocess per variant minus "
        "its VmRSS after `echo 5 > /proc/self/clear_refs`, largest over the timed steps "
        "(parameter gradients included; weights, batch, optimizer state excluded); child env "
        f"`{' '.join(f'{k}={v}' for k, v in CHILD_ENV.items())}`. MB = 10⁶ bytes.",
        "",
        text,
        "",
    ]
    if agreement:
        md.append(
            f"Agreement on the same batch and weights: loss {agreement['loss_trl']:.9g} (TRL "
            f"head) and {agreement['loss_gmpo']:.9g} (gmpo head), relative difference "
            f"{agreement['loss_rel_diff']:.2e}; gradient of all parameters, max |Δ| / max |g| "
            f"{agreement['grad_max_abs_diff_over_max_abs']:.2e}, ‖Δ‖ / ‖g‖ "
            f"{agreement['grad_norm_rel_diff']:.2e}; per-token log-probs and entropies of the "
            "scoring pass, max |Δ| / max |x| "
            f"{agreement['logps_max_abs_diff_over_max_abs']:.2e} and "
            f"{agreement['entropies_max_abs_diff_over_max_abs']:.2e}."
        )
        md.append("")
    if checks:
        md += [f"Verdict: `{json.dumps(checks)}`", ""]
    stem.with_suffix(".md").write_text("\n".join(md))
    print(f"wrote {stem.relative_to(REPO)}.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
