"""Time and peak extra memory of the LM head's token log-probs, forward+backward, three ways.

Run from the repository root::

    python benchmarks/bench_lm_head.py            # N = 4096, H = 896, V = 151,936, + N sweep
    python benchmarks/bench_lm_head.py --quick    # tiny sizes: proves the script runs (CI)
    python benchmarks/bench_lm_head.py --tokens 1024,4096 --repeats 3 --sweep-repeats 2
    python benchmarks/bench_lm_head.py --device cuda --tokens 1024,4096 --tag cuda   # a GPU

Paths, on the same seeded inputs (hidden (N, H), weight (V, H), both requiring grad; random
targets; random upstream gradients):

* ``materialized``: ``log_softmax((hidden @ weight.T) / τ).gather(-1, targets)`` (and the entropy
  ``-(p * log p).sum(-1)`` of the same distribution in ``--outputs logp+entropy``), plain autograd.
* ``TRL <v> chunked``: ``trl.kernels.ChunkedLogProbFunction`` as GRPOTrainer calls it (vocabulary
  chunk 32,768, 4,096-token tiles), when trl is importable.
* ``gmpo``: ``gmpo_core.lm_head.token_logprobs`` with ``chunk_size`` (default: the library's).

Each measurement runs in a FRESH subprocess: it builds the inputs, runs a tiny warmup (so
one-time library initialization is not counted), resets the process's high-water mark
(``echo 5 > /proc/self/clear_refs``), reads VmRSS, runs one forward+backward (``loss =
Σ g·logps (+ Σ g_H·entropies)``, then ``loss.backward()``), and reads VmHWM. Peak extra memory
is VmHWM − VmRSS-after-reset: everything the call allocated, the weight and hidden gradients
included, the inputs excluded. Time is the wall time of that call. Paths are interleaved within
each repeat so that changes in the machine's load hit them alike; the table reports the minimum
time over repeats (and every repeat in the JSON) and the maximum peak.

Gradients are compared across paths at every size: each subprocess saves its log-probs,
entropies, hidden gradient and every 97th row of the weight gradient, and the parent reports the
largest difference from the materialized path (relative to that tensor's largest magnitude).

On ``--device cuda`` the inputs are moved to the GPU after they are built (same values), the
time is taken between ``torch.cuda.synchronize()`` calls, and the peak extra memory is
``torch.cuda.max_memory_allocated()`` minus the memory allocated before the call (the caching
allocator's view, reset before the call); no plots are drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from _common import (
    IMG_DIR,
    REPO,
    RESULTS,
    cpu_model,
    dist_version,
    run_meta,
)
from _lm_head_worker import W_ROW_STRIDE, worker

#: where this benchmark writes (``make figures-lm-head``)
RESULTS_DIR = RESULTS / "figures-lm-head"

PATHS = ("materialized", "trl", "gmpo", "gmpo-fp32-backward")
#: the paths run unless --paths says otherwise (gmpo-fp32-backward: the same code on the CPU)
DEFAULT_PATHS = PATHS[:3]


# --------------------------------------------------------------------------------------------
# worker: one path, one size, one fresh process


def _run_worker(
    path: str, n: int, args: argparse.Namespace, save: str | None
) -> dict[str, float] | str:
    cmd = [
        sys.executable, __file__, "--worker", "--path", path, "--n", str(n),
        "--hidden", str(args.hidden), "--vocab", str(args.vocab),
        "--temperature", str(args.temperature), "--outputs", args.outputs, "--seed", str(args.seed),
        "--device", args.device, "--dtype", args.dtype,
    ]  # fmt: skip
    if args.chunk_size is not None:
        cmd += ["--chunk-size", str(args.chunk_size)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if save:
        cmd += ["--save", save]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return f"failed (rc {proc.returncode}): {tail[0][:200]}"
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _compare(saved: dict[str, str]) -> dict[str, dict[str, float]]:
    """Largest |x − materialized| / max|materialized| per saved tensor, for each other path."""
    import torch

    if "materialized" not in saved:
        return {}
    ref = torch.load(saved["materialized"], map_location="cpu")
    out: dict[str, dict[str, float]] = {}
    for path, file in saved.items():
        if path == "materialized":
            continue
        got = torch.load(file, map_location="cpu")
        diffs: dict[str, float] = {}
        for key, r in ref.items():
            if r is None or got.get(key) is None:
                continue
            scale = r.abs().max().clamp(min=1e-30)
            diffs[key] = float(((got[key].double() - r.double()).abs().max() / scale).item())
        out[path] = diffs
    return out


def _fmt_gb(b: float | None) -> str:
    return "—" if b is None else f"{b / 1e9:.2f}"


def _fmt_s(s: float | None) -> str:
    return "—" if s is None else (f"{s:.2f}" if s < 100 else f"{s:.0f}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (< 30 s), no files written")
    p.add_argument("--tokens", default=None, help="comma-separated N values (default 512..4096)")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--outputs", choices=("logp", "logp+entropy"), default="logp")
    p.add_argument("--chunk-size", type=int, default=None, help="gmpo's chunk (default: library)")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS), help=f"of {','.join(PATHS)}")
    p.add_argument("--dtype", default="float32", help="hidden and weight dtype (bfloat16: a GPU's)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats at the largest N")
    p.add_argument("--sweep-repeats", type=int, default=1, help="interleaved repeats at other N")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--tag", default="cpu", help="results file name: lm_head_<tag>.md/.json")
    p.add_argument("--device", default="cpu", help="cpu or cuda (GPU memory from torch.cuda)")
    # worker mode (internal)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    if args.quick:
        args.hidden, args.vocab = min(args.hidden, 64), min(args.vocab, 2000)
        if args.chunk_size is None:
            args.chunk_size = 48
        args.no_write = True
        args.repeats = 1
    default_tokens = "200" if args.quick else "512,1024,2048,4096"
    tokens = [int(x) for x in (args.tokens or default_tokens).split(",")]
    trl_version = dist_version("trl")
    paths = [x for x in args.paths.split(",") if x]
    for x in paths:
        if x not in PATHS:
            p.error(f"unknown path {x!r}; choose from {PATHS}")
    labels = {
        "materialized": "materialized (h @ W.T, log_softmax, gather)",
        "trl": f"TRL {trl_version} ChunkedLogProbFunction"
        if trl_version
        else "TRL (not installed)",
        "gmpo": "gmpo token_logprobs",
        "gmpo-fp32-backward": "gmpo token_logprobs, backward_precision='float32'",
    }
    import torch

    from gmpo_core.lm_head import DEFAULT_CHUNK_SIZE

    chunk = DEFAULT_CHUNK_SIZE if args.chunk_size is None else args.chunk_size
    cuda = args.device.startswith("cuda")
    machine = torch.cuda.get_device_name(0) if cuda else cpu_model()
    print(
        f"# N in {tokens}, H = {args.hidden}, V = {args.vocab}, {args.dtype}, outputs {args.outputs}, "
        f"τ = {args.temperature}, gmpo chunk_size = {chunk}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {machine}, device {args.device}",
        flush=True,
    )
    results: dict[int, dict[str, Any]] = {}
    max_n = max(tokens)
    with tempfile.TemporaryDirectory() as tmp:
        for n in tokens:
            repeats = args.repeats if n == max_n else args.sweep_repeats
            row: dict[str, Any] = {x: {"seconds": [], "peak_extra_bytes": []} for x in paths}
            saved: dict[str, str] = {}
            for rep in range(repeats):
                for x in paths:
                    if x == "trl" and trl_version is None:
                        row[x] = "not installed"
                        continue
                    save = os.path.join(tmp, f"{x}_{n}.pt") if rep == 0 else None
                    r = _run_worker(x, n, args, save)
                    if isinstance(r, str):
                        row[x] = r
                        print(f"N={n:>6} {x:>13}: {r}", flush=True)
                        continue
                    if save:
                        saved[x] = save
                    row[x]["seconds"].append(r["seconds"])
                    row[x]["peak_extra_bytes"].append(r["peak_extra_bytes"])
                    print(
                        f"N={n:>6} {x:>13}: {r['seconds']:8.2f} s  "
                        f"peak extra {r['peak_extra_bytes'] / 1e9:6.3f} GB",
                        flush=True,
                    )
            row["max_rel_diff_vs_materialized"] = _compare(saved)
            results[n] = row

    def best(n: int, x: str, key: str) -> float | None:
        r = results[n].get(x)
        if not isinstance(r, dict) or not r[key]:
            return None
        return float(min(r[key]) if key == "seconds" else max(r[key]))

    # ---- table
    lines = [
        "| N | path | time (s) | peak extra (GB) | time / materialized | memory / materialized |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for n in tokens:
        t_ref, m_ref = (
            best(n, "materialized", "seconds"),
            best(n, "materialized", "peak_extra_bytes"),
        )
        for x in paths:
            t, m = best(n, x, "seconds"), best(n, x, "peak_extra_bytes")
            r = results[n][x]
            if not isinstance(r, dict):
                lines.append(f"| {n} | {labels[x]} | {r} | | | |")
                continue
            tr = "—" if t is None or t_ref is None else f"{t / t_ref:.2f}×"
            mr = "—" if m is None or m_ref is None else f"{m / m_ref:.3f}×"
            lines.append(f"| {n} | {labels[x]} | {_fmt_s(t)} | {_fmt_gb(m)} | {tr} | {mr} |")
    table = "\n".join(lines)
    diff_lines = [
        "| N | path | logps | entropies | grad hidden | grad weight (rows) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for n in tokens:
        for x, d in results[n]["max_rel_diff_vs_materialized"].items():
            cells = [
                f"{d[k]:.1e}" if k in d else "—"
                for k in ("logps", "entropies", "grad_hidden", "grad_weight_rows")
            ]
            diff_lines.append(f"| {n} | {labels[x]} | " + " | ".join(cells) + " |")
    diff_table = "\n".join(diff_lines)
    print()
    print(table)
    print()
    print("max |x − materialized| / max |materialized|:")
    print(diff_table)

    # ---- targets at the largest N
    checks: dict[str, Any] = {}
    t_ref, m_ref = (
        best(max_n, "materialized", "seconds"),
        best(max_n, "materialized", "peak_extra_bytes"),
    )
    t_g, m_g = best(max_n, "gmpo", "seconds"), best(max_n, "gmpo", "peak_extra_bytes")
    if t_g is not None and m_g is not None:
        checks["gmpo_peak_extra_gb"] = m_g / 1e9
        checks["gmpo_peak_le_0.9GB"] = m_g <= 0.9e9
        if t_ref is not None and m_ref is not None:
            checks["gmpo_time_over_materialized"] = t_g / t_ref
            checks["gmpo_time_le_1.5x"] = t_g <= 1.5 * t_ref
            checks["materialized_memory_over_gmpo"] = m_ref / m_g
    t_trl, m_trl = best(max_n, "trl", "seconds"), best(max_n, "trl", "peak_extra_bytes")
    if t_g is not None and m_g is not None and t_trl is not None and m_trl is not None:
        checks["trl_time_over_gmpo"] = t_trl / t_g
        checks["trl_memory_over_gmpo"] = m_trl / m_g
    print()
    print("at N =", max_n, json.dumps(checks, indent=1))

    if args.no_write:
        return 0
    meta = {
        **run_meta(__file__, argv, trl_version),
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "python": platform.python_version(),
        "hidden": args.hidden,
        "vocab": args.vocab,
        "dtype": args.dtype,
        "outputs": args.outputs,
        "temperature": args.temperature,
        "gmpo_chunk_size": chunk,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stem = RESULTS_DIR / f"lm_head_{args.tag}"
    json_results = {str(n): results[n] for n in tokens}
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "results": json_results, "targets_at_max_n": checks}, indent=1)
        + "\n"
    )
    md = [
        f"# LM-head token log-probs, forward+backward ({meta['date_utc']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"torch {meta['torch']}, trl {trl_version}, {meta['threads']} threads, {meta['cpu']}, "
        f"Python {meta['python']}, device {args.device}"
        + (f" ({meta['gpu']})" if cuda else "")
        + ".  ",
        f"H = {args.hidden}, V = {args.vocab}, {args.dtype}, outputs: {args.outputs}, "
        f"temperature {args.temperature}, gmpo chunk_size {chunk}. Time: minimum over repeats; "
        + (
            "peak extra: torch.cuda.max_memory_allocated() of a fresh subprocess minus the memory "
            "allocated before the call (weight gradient included, inputs excluded)."
            if cuda
            else "peak extra: VmHWM of a fresh subprocess minus its RSS after the reset (weight "
            "gradient included, inputs excluded)."
        ),
        "",
        table,
        "",
        "Largest |x − materialized| / max |materialized| (weight gradient: every "
        f"{W_ROW_STRIDE}th row):",
        "",
        diff_table,
        "",
        f"Targets at N = {max_n}: `{json.dumps(checks)}`",
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(md))
    print(f"wrote {stem}.md/.json")

    if len(tokens) > 1 and not cuda:  # the docs' figures are the CPU run's
        _plots(tokens, paths, labels, best, meta)
    return 0


def _plots(
    tokens: list[int], paths: list[str], labels: dict[str, str], best: Any, meta: dict[str, Any]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG_DIR.mkdir(parents=True, exist_ok=True)
    style = {
        "materialized": ("o-", "tab:red"),
        "trl": ("s-", "tab:orange"),
        "gmpo": ("^-", "tab:blue"),
        "gmpo-fp32-backward": ("v-", "tab:cyan"),
    }
    for key, ylabel, fname, scale in (
        ("peak_extra_bytes", "peak extra memory (GB)", "lm_head_memory.png", 1e-9),
        ("seconds", "forward+backward time (s)", "lm_head_time.png", 1.0),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
        for x in paths:
            pts = [(n, best(n, x, key)) for n in tokens]
            pts = [(n, v * scale) for n, v in pts if v is not None]
            if pts:
                mk, color = style[x]
                ax.plot([a for a, _ in pts], [b for _, b in pts], mk, color=color, label=labels[x])
        ax.set_xscale("log", base=2)
        ax.set_xticks(tokens, [str(n) for n in tokens])
        ax.set_xlabel("tokens N")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title(
            f"LM head, H={meta['hidden']}, V={meta['vocab']:,}, float32, CPU ({meta['threads']} threads)",
            fontsize=9,
        )
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(IMG_DIR / fname)
        plt.close(fig)
        print(f"wrote docs/img/{fname}")


if __name__ == "__main__":
    sys.exit(main())
