"""The LM head and the loss fused: gmpo's ``token_logprobs`` + ``gmpo_loss`` against liger-kernel's
``LigerFusedLinearGRPOLoss`` and TRL's materialized path, forward+backward, on the same inputs.

Run from the repository root, in an environment with liger-kernel (``pip install -e ".[bench]"``;
``make figures-liger`` builds one)::

    python benchmarks/bench_liger.py             # the CPU sweep -> results/figures-bench/liger_cpu.*
    python benchmarks/bench_liger.py --quick     # tiny sizes, every path: proves it runs
    python benchmarks/bench_liger.py --device cuda --shapes 2x128256,4x128256,8x128256,16x128256 \\
        --hidden 4096 --dtypes bfloat16 --tag cuda    # Liger's own shapes (scripts/gpu.sh)

Liger's benchmark (``benchmark/scripts/benchmark_grpo_loss.py`` in its repository) sweeps
B in {2, 4, 8, 16} at T 1024, H 4096, V 128,256 in bf16, and reports the median and the 20th and
80th percentiles of the time, and the peak memory. Here, on a 2-core CPU with 24 GB, the default
sweep keeps T 1024 and scales the rest down: B in {1, 2, 4}, H 896 (Qwen2.5-0.5B's), V 32,000
and 151,936, float32 and bf16, at 1 and 2 threads.

* **speed**: one process per (shape, dtype, threads) runs every path on the same inputs, one
  warm-up call each (compilation), then ``--repeats`` calls each, the paths taking turns call by
  call; the clock is the process's CPU time (all its threads: other processes on the machine do
  not inflate it), and the table gives its median and 20th/80th percentiles (wall time in the
  JSON). On CUDA: wall time between synchronizations.
* **memory**: each path in a fresh process (1 thread, ``MALLOC_ENV``: every buffer over 128 KiB
  mapped on allocation, unmapped on free), a warm-up call, then one call's VmHWM over its VmRSS
  (both gradients included, the inputs excluded). On CUDA: ``torch.cuda.max_memory_allocated``
  over what was allocated before the call, in the timing process.
* **values**: every path's loss and gradients (of the hidden states, and every 97th row of the
  weight's) against gmpo plain's, from the warm-up calls.

Equal work: Liger runs with ``beta=0`` and no reference model (no KL term; its own benchmark
computes one with a second LM head), gmpo and TRL without KL; the old log-probs are the policy's
own, so every objective here has the value -mean(A) and the same gradient (checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from _common import MALLOC_ENV, REPO, RESULTS, dist_version, environment, write_results
from _liger_worker import DEFAULT_PATHS, PATHS, worker

RESULTS_DIR = RESULTS / "figures-bench"
LIGER = "liger-kernel"
#: B x V at T 1024, H 896: Liger's sweep (B 2-16, H 4096, V 128,256) scaled to 2 cores
SHAPES = "1x32000,1x151936,4x32000"


def _child(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any] | str:
    import os

    proc = subprocess.run(
        [sys.executable, __file__, "--worker", *cmd],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=None if env is None else {**os.environ, **env},
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return f"failed (rc {proc.returncode}): {tail[0][:300]}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _in_process(p: argparse.ArgumentParser, cmd: list[str]) -> dict[str, Any]:
    import torch
    from _liger_worker import time_paths

    args = p.parse_args(["--worker", *cmd])
    torch.set_num_threads(int(args.threads))
    return time_paths(args)


def _pct(values: list[float], q: float) -> float:
    """The q-quantile (linear interpolation between order statistics)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "p20": _pct(values, 0.2), "p80": _pct(values, 0.8)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 calls, nothing written")
    p.add_argument(
        "--shapes", default=SHAPES, help="comma-separated BxV (T and H: --seq, --hidden)"
    )
    p.add_argument("--seq", type=int, default=1024, help="T")
    p.add_argument("--hidden", type=int, default=896, help="H")
    p.add_argument("--vocabs", default="32000,151936", help="comma-separated V")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per path (after 1 warm-up)")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS), help=f"of {','.join(PATHS)}")
    p.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default="cpu", help="results file: results/figures-bench/liger_<tag>.*")
    p.add_argument("--no-write", action="store_true", help="print only")
    # worker mode (internal)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    for name in ("b", "t", "h", "v"):
        p.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.threads = int(args.threads)
        worker(args)
        return 0
    argv = sys.argv[1:] if argv is None else list(argv)
    if dist_version(LIGER) is None:
        print(f"{LIGER} is not installed: pip install -e '.[bench]' (make figures-liger)")
        return 2
    if args.quick:
        args.shapes, args.seq, args.hidden = "2x500", 16, 32
        args.threads, args.repeats, args.no_write = "1", 2, True
    cuda = args.device.startswith("cuda")
    paths = args.paths.split(",")
    for x in paths:
        if x not in PATHS:
            p.error(f"unknown path {x!r}; choose from {PATHS}")
    shapes = [  # each shape in both dtypes before the next shape
        (dtype, int(v), int(b))
        for b, v in (s.split("x") for s in args.shapes.split(","))
        for dtype in args.dtypes.split(",")
    ]
    threads = [int(s) for s in args.threads.split(",")]
    rows: list[dict[str, Any]] = []
    stem = RESULTS_DIR / f"liger_{args.tag}"
    result: dict[str, Any] = {
        "liger_kernel": dist_version(LIGER),
        "paths": paths,
        "repeats": args.repeats,
        "device": args.device,
        "planned": [f"{dtype} B={b} V={v}" for dtype, v, b in shapes],
        "rows": rows,
    }
    for dtype, v, b in shapes:
        common = ["--b", str(b), "--t", str(args.seq), "--h", str(args.hidden), "--v", str(v)]
        common += ["--dtype", dtype, "--device", args.device, "--seed", str(args.seed)]
        row: dict[str, Any] = {"dtype": dtype, "V": v, "B": b, "T": args.seq, "H": args.hidden}
        row["timing"], row["memory"] = {}, {}
        for n in threads[:1] if cuda else threads:
            cmd = [*common, "--threads", str(n), "--repeats", str(args.repeats)]
            if args.quick:  # in this process: one start of torch and liger-kernel, not two
                r = _in_process(p, [*cmd, "--paths", ",".join(paths)])
            else:
                r = _child([*cmd, "--paths", ",".join(paths)])
            if isinstance(r, dict):
                r["cpu"] = {k: _summary(t) for k, t in r["cpu_s"].items()}
                r["wall"] = {k: _summary(t) for k, t in r["wall_s"].items()}
                if cuda:
                    row["memory"] = r["peak_extra_bytes"]
            row["timing"][str(n)] = r
            brief = (
                r if isinstance(r, str) else {k: round(s["median"], 3) for k, s in r["cpu"].items()}
            )
            print(f"{dtype} V={v} B={b} threads={n}: {brief}", flush=True)
        if not args.no_memory and not cuda:
            for x in paths:
                cmd = [*common, "--threads", "1", "--paths", x, "--memory"]
                r = _child(cmd, env=MALLOC_ENV)
                row["memory"][x] = r["peak_extra_bytes"] if isinstance(r, dict) else r
            print(f"{dtype} V={v} B={b} memory: {row['memory']}", flush=True)
        rows.append(row)
        if not args.no_write:  # after every row: a run stopped early keeps what it measured
            result["rows"] = rows
            write_results(stem, result, report(result), __file__, argv)
    text = report(result)
    print(text)
    return 0


def report(result: dict[str, Any]) -> str:
    from _liger_report import markdown

    return markdown(result, environment(result))


if __name__ == "__main__":
    sys.exit(main())
