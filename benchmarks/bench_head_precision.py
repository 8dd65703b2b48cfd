"""What each precision of the LM head costs in accuracy against float64, measured on the CPU through
the code a GPU runs; and whether the CPU has a bf16 GEMM with a float32 result.

Run from the repository root::

    python benchmarks/bench_head_precision.py           # -> results/figures-lm-head/precision_cpu.*
    python benchmarks/bench_head_precision.py --quick   # tiny sizes, nothing written (CI)

**Accuracy.** ``token_logprobs`` plans its GEMMs with ``gemm_plan`` (gmpo_core/_gemms.py); here it
is planned as on CUDA, and the two CUDA-only float32-output overloads it then calls
(``aten::mm.dtype_out``, ``aten::addmm.dtype_out``) are given CPU kernels for this process
(``torch.library``) that multiply the operands upcast to float32: a product of two bf16/fp16
numbers is exact in float32, so the results are a GPU's up to the order of summation. Each
choice's log-probs, entropies and gradients (of ``Σ g·logps + Σ g_H·entropies``) are compared with
the same loss computed in float64 from the same input values (materialized logits): the largest
|x − ref| over the largest |ref| of each tensor. Choices: ``float32`` (every GEMM in float32: the
CPU's path, and the head before half-precision GEMMs), ``half`` (the default on CUDA: half
operands, float32 logits, ∂L/∂z rounded to half for the backward's GEMMs), ``half, float32
backward`` (``backward_precision="float32"``), and TRL 1.16's ``ChunkedLogProbFunction``, whose
tiles are in the weight's (or autocast's) dtype on every device (its logits rounded to bf16).

**The CPU.** Which public torch ops multiply bf16 matrices into a float32 result on this CPU, and
the time of one GEMM of the head's shape in float32 and in bf16 (a bf16 result), interleaved.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import RESULTS, cpu_model, dist_version, run_meta

RESULTS_DIR = RESULTS / "figures-lm-head"
#: setup -> (inputs' dtype, autocast dtype)
SETUPS = {"bf16 weights": ("bfloat16", None), "fp16 weights": ("float16", None),
          "float32 weights, bf16 autocast": ("float32", "bfloat16")}  # fmt: skip
CHOICES = ("float32", "half", "half, float32 backward", "TRL 1.16 ChunkedLogProbFunction")
KEYS = ("logps", "entropies", "grad_hidden", "grad_weight")
FLOOR = "float64, rounded to the outputs' dtypes (the floor)"


def _cpu_float32_output_kernels() -> Any:
    """CPU kernels for the CUDA-only float32-output GEMMs, for this process."""
    import torch

    lib = torch.library.Library("aten", "IMPL")

    def mm_out(a: Any, b: Any, out_dtype: Any, *, out: Any) -> Any:
        return out.copy_(torch.mm(a.to(out_dtype), b.to(out_dtype)))

    def addmm_out(c: Any, a: Any, b: Any, out_dtype: Any, *, beta: Any = 1, alpha: Any = 1,
                  out: Any) -> Any:  # fmt: skip
        up = torch.addmm(c.to(out_dtype), a.to(out_dtype), b.to(out_dtype), beta=beta, alpha=alpha)
        return out.copy_(up)

    lib.impl("mm.dtype_out", mm_out, "CPU")
    lib.impl("addmm.dtype_out", addmm_out, "CPU")
    return lib


def _inputs(n: int, h: int, v: int, dtype: str, init: str) -> dict[str, Any]:
    """``init`` "wide": weight N(0, 16/H), logits of std about 4; "linear": nn.Linear's
    U(±1/√H), Liger's benchmark footing (bench_liger.py)."""
    import torch

    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    hidden = torch.randn(n, h, generator=g)
    if init == "wide":
        weight = torch.randn(v, h, generator=g) * (4.0 / h**0.5)
    else:
        weight = (torch.rand(v, h, generator=g) * 2 - 1) / h**0.5
    return {
        "hidden": hidden.to(dt),
        "weight": weight.to(dt),
        "targets": torch.randint(0, v, (n,), generator=g),
        "g_logp": torch.randn(n, generator=g),
        "g_ent": torch.randn(n, generator=g) * 0.1,
    }


def _run(fn: Callable[..., Any], x: dict[str, Any], dtype: Any = None) -> dict[str, Any]:
    import torch

    hidden = x["hidden"].to(dtype or x["hidden"].dtype).clone().requires_grad_()
    weight = x["weight"].to(dtype or x["weight"].dtype).clone().requires_grad_()
    logps, entropies = fn(hidden, weight, x["targets"])
    loss = (logps.double() * x["g_logp"].double()).sum()
    loss = loss + (entropies.double() * x["g_ent"].double()).sum()
    loss.backward()
    assert hidden.grad is not None and weight.grad is not None
    out = {"logps": logps, "entropies": entropies, "grad_hidden": hidden.grad}
    out["grad_weight"] = weight.grad
    return {k: t.detach().to(torch.float64) for k, t in out.items()}


def _reference(h: Any, w: Any, t: Any, temperature: float) -> tuple[Any, Any]:
    import torch

    logp_all = torch.log_softmax((h @ w.t()) / temperature, dim=-1)
    return logp_all.gather(-1, t.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def accuracy(
    n: int, h: int, v: int, temperature: float, init: str, setups: list[str]
) -> dict[str, dict[str, Any]]:
    import torch
    from trl.kernels import ChunkedLogProbFunction

    import gmpo_core.lm_head as lm_head

    real_plan = lm_head.gemm_plan
    lib = _cpu_float32_output_kernels()
    out: dict[str, dict[str, Any]] = {}
    for setup in setups:
        dtype, autocast = SETUPS[setup]
        x = _inputs(n, h, v, dtype, init)
        ac = None if autocast is None else getattr(torch, autocast)
        ref = _run(lambda a, b, t: _reference(a, b, t, temperature), x, torch.float64)

        def ours(backward: str, device: str, ac: Any = ac) -> Callable[..., Any]:
            def planned(a: Any, b: Any, t: Any) -> Any:
                lm_head.gemm_plan = lambda _d, *dt: real_plan(device, *dt[:3], ac, dt[4])  # type: ignore[assignment]
                try:
                    return lm_head.token_logprobs(
                        a, b, t, temperature=temperature, backward_precision=backward
                    )
                finally:
                    lm_head.gemm_plan = real_plan  # type: ignore[assignment]

            return planned

        def trl(a: Any, b: Any, t: Any, ac: Any = ac) -> Any:
            with torch.autocast("cpu", dtype=ac, enabled=ac is not None):
                got = ChunkedLogProbFunction.apply(
                    a, b, None, t, temperature, 32768, None, 1.0, ("entropy",)
                )
            return got[0], got[1]

        fns = {"float32": ours("half", "cpu"), "half": ours("half", "cuda"),
               "half, float32 backward": ours("float32", "cuda"), CHOICES[3]: trl}  # fmt: skip
        # the floor: the float64 results rounded to the outputs' dtypes (float32 log-probs and
        # entropies, gradients in the inputs' dtype)
        floor = {k: ref[k].to(torch.float32 if k in KEYS[:2] else x["hidden"].dtype).double()
                 for k in KEYS}  # fmt: skip
        row: dict[str, Any] = {
            FLOOR: {k: float((floor[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in KEYS}
        }
        for choice, fn in fns.items():
            got = _run(fn, x)
            row[choice] = {
                k: float((got[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in KEYS
            }
            print(f"{setup:32} {choice:34} " + " ".join(f"{row[choice][k]:.1e}" for k in KEYS),
                  flush=True)  # fmt: skip
        out[setup] = row
    del lib
    return out


def cpu_bf16(h: int, v: int, n: int, repeats: int) -> dict[str, Any]:
    """Public ops that could multiply bf16 into float32 on this CPU, and one GEMM's time."""
    import torch

    a = torch.randn(n, h).bfloat16()
    b = torch.randn(v, h).bfloat16()
    probes: dict[str, Callable[[], Any]] = {
        "torch.mm(bf16, bf16, out_dtype=torch.float32)": lambda: torch.mm(
            a, b.t(), out_dtype=torch.float32
        ),
        "torch.addmm(f32, bf16, bf16, out_dtype=torch.float32)": lambda: torch.addmm(
            torch.zeros(v), a, b.t(), out_dtype=torch.float32
        ),
        "torch.mm(bf16, bf16, out=<float32 tensor>)": lambda: torch.mm(
            a, b.t(), out=torch.empty(n, v)
        ),
        "torch.matmul under torch.autocast('cpu', bfloat16), float32 inputs": lambda: _autocast_mm(
            a.float(), b.float()
        ),
    }
    found: dict[str, str] = {}
    for name, probe in probes.items():
        try:
            found[name] = f"runs, result {probe().dtype}"
        except (RuntimeError, NotImplementedError) as err:
            found[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:90]}"
    af, bf = a.float(), b.float()
    paths: dict[str, Callable[[], Any]] = {
        "float32 GEMM": lambda: torch.mm(af, bf.t()),
        "bf16 GEMM (bf16 result)": lambda: torch.mm(a, b.t()),
        "bf16 GEMM, result upcast to float32": lambda: torch.mm(a, b.t()).float(),
    }
    times: dict[str, list[float]] = {k: [] for k in paths}
    for p in paths.values():
        p()  # warm-up
    for _ in range(repeats):
        for name, p in paths.items():
            t0 = time.process_time()
            p()
            times[name].append(time.process_time() - t0)
    ref = af.double() @ bf.double().t()
    err = {
        "float32 GEMM": float((torch.mm(af, bf.t()).double() - ref).abs().max() / ref.abs().max()),
        "bf16 GEMM (bf16 result)": float(
            (torch.mm(a, b.t()).double() - ref).abs().max() / ref.abs().max()
        ),
    }
    return {"probes": found, "seconds": times, "logits_error": err, "shape": [n, h, v]}


def _autocast_mm(a: Any, b: Any) -> Any:
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        return torch.matmul(a, b.t())


def report(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# The LM head's precision choices against float64 ({meta['date_utc']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"torch {meta['torch']}, trl {meta['trl']}, {meta['cpu']}. N {meta['n']}, H {meta['h']}, "
        f"V {meta['v']}, temperature {meta['temperature']}, weight init {meta['init']}; loss "
        "Σ g·logps + Σ g_H·entropies. "
        "GEMMs planned as on CUDA, the float32-output overloads run on the CPU on upcast operands "
        "(exact products, float32 sums).",
        "",
        "Largest |x − float64| / max |float64| of each tensor:",
        "",
        "| setup | choice | logps | entropies | grad hidden | grad weight |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for setup, row in result["accuracy"].items():
        for choice, d in row.items():
            cells = " | ".join(f"{d[k]:.1e}" for k in KEYS)
            lines.append(f"| {setup} | {choice} | {cells} |")
    if "cpu_bf16" not in result:
        return "\n".join(lines) + "\n"
    cpu = result["cpu_bf16"]
    n, h, v = cpu["shape"]
    lines += ["", f"## bf16 GEMMs on this CPU ({meta['cpu']})", "",
              "| public op | on the CPU |", "|---|---|"]  # fmt: skip
    lines += [f"| `{k}` | {val} |" for k, val in cpu["probes"].items()]
    lines += ["", f"One GEMM ({n}, {h}) × ({h}, {v}), process CPU time, minimum of "
              f"{len(next(iter(cpu['seconds'].values())))} interleaved calls (one thread):", "",
              "| GEMM | ms | logits' error vs float64 |", "|---|---:|---:|"]  # fmt: skip
    for k, ts in cpu["seconds"].items():
        e = cpu["logits_error"].get(k)
        lines.append(f"| {k} | {min(ts) * 1e3:.1f} | {'' if e is None else f'{e:.1e}'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, nothing written")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--repeats", type=int, default=3, help="interleaved calls of each CPU GEMM")
    p.add_argument("--init", choices=("wide", "linear"), default="wide")
    p.add_argument("--setups", default=";".join(SETUPS), help="setups, separated by ;")
    p.add_argument("--no-cpu-gemms", action="store_true", help="skip the CPU bf16 GEMM part")
    p.add_argument("--tag", default="cpu", help="results file: precision_<tag>.md/.json")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.quick:
        args.tokens, args.hidden, args.vocab, args.repeats = 40, 16, 300, 1
    meta = {**run_meta(__file__, argv, dist_version("trl")), "cpu": cpu_model(),
            "n": args.tokens, "h": args.hidden, "v": args.vocab, "temperature": args.temperature,
            "init": args.init}  # fmt: skip
    setups = args.setups.split(";")
    result: dict[str, Any] = {
        "meta": meta,
        "accuracy": accuracy(
            args.tokens, args.hidden, args.vocab, args.temperature, args.init, setups
        ),
    }
    if not args.no_cpu_gemms:
        result["cpu_bf16"] = cpu_bf16(896 if not args.quick else 16, 8192 if not args.quick
                                      else 64, 256 if not args.quick else 8, args.repeats)  # fmt: skip
    text = report(result)
    print(text)
    if not args.quick:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stem = RESULTS_DIR / f"precision_{args.tag}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        stem.with_suffix(".md").write_text(text)
        print(f"wrote {stem}.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
