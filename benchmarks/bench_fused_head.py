"""The LM head alone, in bf16, at the three model shapes of ``benchmarks/head_model.py``: gmpo_core's
fused Triton head (``token_logprobs(backend="triton")``), its torch backend, TRL 1.16's
``ChunkedLogProbFunction`` and Liger's fused linear cross-entropy (log-probs only: it has no
entropy), where installed. Per head: forward+backward time (CUDA events, the minimum over the
repeats after a warm-up), peak memory beyond the inputs, and the log-probs' and entropies' error
against float64 on the same bf16 inputs (the largest |x − ref| over the largest |ref|).

Run from the repository root::

    python benchmarks/bench_fused_head.py --device cuda    # -> results/figures-lm-head/fused_head_cuda.*
    python benchmarks/bench_fused_head.py --quick          # CPU, Triton's interpreter, tiny; nothing written
    python benchmarks/bench_fused_head.py --accuracy       # CPU, interpreter: -> fused_head_interpreter.md

On the CPU the fused kernels run in Triton's interpreter (this script sets ``TRITON_INTERPRET=1``
before anything imports Triton), so only the errors mean anything there.
"""

from __future__ import annotations

import os
import sys

if "cuda" not in " ".join(sys.argv):  # before torch (torch._dynamo imports Triton)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from _common import RESULTS, dist_version, run_meta
from head_model import MODELS

RESULTS_DIR = RESULTS / "figures-lm-head"
HEADS = ("gmpo fused (triton)", "gmpo torch backend", "TRL 1.16", "Liger")


def _head(name: str) -> Callable[..., Any]:
    """``f(h, w, y) -> (logps, entropies or None)`` of one head; ImportError where absent."""
    if name.startswith("gmpo"):
        from gmpo_core.lm_head import token_logprobs

        backend = "triton" if "triton" in name else "torch"
        return lambda h, w, y: token_logprobs(h, w, y, backend=backend)
    if name == "TRL 1.16":
        from trl.kernels import ChunkedLogProbFunction

        def trl(h: Any, w: Any, y: Any) -> Any:
            out = ChunkedLogProbFunction.apply(h, w, None, y, 1.0, 32_768, None, 1.0, ("entropy",))
            return out[0], out[1]

        return trl
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    def liger(h: Any, w: Any, y: Any) -> Any:
        return -liger_fused_linear_cross_entropy(h, w, y, reduction="none"), None

    return liger


def _reference(h: Any, w: Any, y: Any, chunk: int = 256) -> tuple[Any, Any]:
    """float64 log-probs and entropies of the same inputs, ``chunk`` tokens at a time."""
    import torch

    lp, ent = [], []
    w64 = w.double()
    for s in range(0, h.shape[0], chunk):
        z = torch.log_softmax(h[s : s + chunk].double() @ w64.T, -1)
        lp.append(z.gather(1, y[s : s + chunk, None])[:, 0])
        ent.append(-(z.exp() * z).sum(-1))
    return torch.cat(lp), torch.cat(ent)


def _err(got: Any, ref: Any) -> float:
    return float((got.double() - ref).abs().max() / ref.abs().max())


def measure(name: str, hid: int, vocab: int, n: int, device: str, repeats: int) -> dict[str, Any]:
    import torch

    try:
        head = _head(name)
    except ImportError as exc:
        return {"skipped": f"not installed: {exc}"}
    g = torch.Generator(device="cpu").manual_seed(0)
    h = torch.randn(n, hid, generator=g).to(device, torch.bfloat16).requires_grad_()
    w = (torch.randn(vocab, hid, generator=g) * 3 / hid**0.5).to(device, torch.bfloat16)
    w.requires_grad_()
    y = torch.randint(0, vocab, (n,), generator=g).to(device)
    gl, ge = torch.randn(n, generator=g).to(device), torch.randn(n, generator=g).to(device)
    cuda = device == "cuda"
    times, peak = [], 0
    for i in range(repeats + 1):
        h.grad = w.grad = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        logps, ent = head(h, w, y)
        loss = (logps * gl).sum() + (0 if ent is None else (ent * ge).sum())
        loss.backward()
        if cuda:
            end.record()
            torch.cuda.synchronize()
            if i:  # the first call compiles and warms up
                times.append(start.elapsed_time(end) / 1e3)
                peak = max(peak, torch.cuda.max_memory_allocated() - base)
    ref_lp, ref_ent = _reference(h.detach(), w.detach(), y)
    return {"seconds": min(times) if times else None, "peak_extra_bytes": peak if cuda else None,
            "err_logps": _err(logps.detach(), ref_lp),
            "err_entropies": None if ent is None else _err(ent.detach(), ref_ent)}  # fmt: skip


def accuracy(n: int, hid: int, vocab: int, temperature: float) -> list[str]:
    """The fused and torch backends against float64 per input dtype, with a bias, on the CPU
    (the fused kernels in the interpreter): the largest |x − ref| over the largest |ref| of the
    log-probs, entropies and the gradients of ``Σ g·logps + Σ g_H·entropies``."""
    import torch

    from gmpo_core.lm_head import token_logprobs

    g = torch.Generator().manual_seed(0)
    h0, w0 = torch.randn(n, hid, generator=g), torch.randn(vocab, hid, generator=g) * 3 / hid**0.5
    b0, y = torch.randn(vocab, generator=g), torch.randint(0, vocab, (n,), generator=g)
    gl, ge = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g)
    lines = ["| dtype | backend | logps | entropies | grad hidden | grad weight | grad bias |",
             "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        leaves = [t.to(dtype) for t in (h0, w0, b0)]  # the rounded inputs, for every path
        ref = [t.double().requires_grad_() for t in leaves]
        z = torch.log_softmax((ref[0] @ ref[1].T + ref[2]) / temperature, -1)
        ref_lp, ref_ent = z.gather(1, y[:, None])[:, 0], -(z.exp() * z).sum(-1)
        ref_g = torch.autograd.grad((ref_lp * gl).sum() + (ref_ent * ge.double()).sum(), ref)
        for backend in ("triton", "torch"):
            x = [t.clone().requires_grad_() for t in leaves]
            lp, ent = token_logprobs(x[0], x[1], y, bias=x[2], temperature=temperature,
                                     backend=backend)  # fmt: skip
            got = torch.autograd.grad((lp * gl.float()).sum() + (ent * ge).sum(), x)
            errs = [_err(lp.detach(), ref_lp.detach()), _err(ent.detach(), ref_ent.detach())]
            errs += [_err(a, r) for a, r in zip(got, ref_g, strict=True)]
            lines.append(f"| {str(dtype)[6:]} | {backend} | "
                         + " | ".join(f"{e:.1e}" for e in errs) + " |")  # fmt: skip
            print(lines[-1], flush=True)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU interpreter, tiny; nothing written")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--heads", default=";".join(HEADS), help="separated by ;")
    p.add_argument("--tag", default="cuda")
    p.add_argument("--accuracy", action="store_true",
                   help="the CPU interpreter's accuracy table (N 256, H 128, V 2,000, τ 0.7) "
                   "-> results/figures-lm-head/fused_head_interpreter.md")  # fmt: skip
    args = p.parse_args(argv)
    import torch

    if args.accuracy:
        meta = run_meta(__file__, argv, dist_version("trl"))
        lines = accuracy(256, 128, 2000, 0.7)
        md = "\n".join([f"# The fused head in Triton's interpreter against float64 "
                        f"({meta['date_utc']})", "", f"Command: `{meta['command']}`  ",
                        f"torch {meta['torch']}, triton {dist_version('triton')}; N 256, H 128, "
                        "V 2,000 (ragged blocks), temperature 0.7, with a bias; loss "
                        "Σ g·logps + Σ g_H·entropies; largest |x − float64| over largest "
                        "|float64|, per tensor.", "", *lines, ""])  # fmt: skip
        print(md)
        if not args.quick:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            (RESULTS_DIR / "fused_head_interpreter.md").write_text(md)
        return 0

    shapes = [(m, h, v) for m, h, v, _ in MODELS]
    if args.quick:
        shapes, args.tokens, args.repeats = [("tiny", 64, 1000)], 40, 1
    rows: dict[str, Any] = {}
    lines = ["| model (H, V) | head | fwd+bwd ms | peak extra GB | logps err | entropies err |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for model, hid, vocab in shapes:
        for name in args.heads.split(";"):
            r = rows[f"{model} | {name}"] = measure(
                name, hid, vocab, args.tokens, args.device, args.repeats
            )
            if "skipped" in r:
                lines.append(f"| {model} ({hid}, {vocab:,}) | {name} | {r['skipped']} | | | |")
                continue
            ms = "—" if r["seconds"] is None else f"{r['seconds'] * 1e3:.2f}"
            gb = "—" if r["peak_extra_bytes"] is None else f"{r['peak_extra_bytes'] / 1e9:.2f}"
            ent = "—" if r["err_entropies"] is None else f"{r['err_entropies']:.1e}"
            lines.append(f"| {model} ({hid}, {vocab:,}) | {name} | {ms} | {gb} "
                         f"| {r['err_logps']:.1e} | {ent} |")  # fmt: skip
            print(lines[-1], flush=True)
    meta = {**run_meta(__file__, argv, dist_version("trl")), "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "tokens": args.tokens, "triton": dist_version("triton")}  # fmt: skip
    md = "\n".join([f"# The LM head alone, bf16, N = {args.tokens} ({meta['date_utc']})", "",
                    f"Command: `{meta['command']}`  ", f"device {args.device} ({meta['gpu']}), "
                    f"torch {meta['torch']}, triton {meta['triton']}", "", *lines, ""])  # fmt: skip
    print(md)
    if not args.quick:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stem = RESULTS_DIR / f"fused_head_{args.tag}"
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        stem.with_suffix(".md").write_text(md)
        print(f"wrote {stem}.md/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
