"""A paper model of the LM head's cost per training token on an H100/H200: FLOPs by GEMM dtype,
and the element-wise passes' memory traffic, for gmpo's torch head before and after
half-precision GEMMs, gmpo's fused Triton head, TRL 1.16's, and (estimates from reading their
code) verl's and Liger's fused kernels. A model, not a measurement (scripts/gpu.sh measures).

Run from the repository root (pure Python, seconds)::

    python benchmarks/head_model.py     # -> results/figures-lm-head/head_model.md

Per token of a training step (forward + backward), with hidden size H and vocabulary V:

* **GEMMs**: the logits' GEMM (2VH FLOP), its recomputation in the backward (2VH), and the two
  gradient GEMMs ∂L/∂z·W and (∂L/∂z)ᵀh (2VH each): 8VH for gmpo's head and TRL's alike. Their
  dtype decides the rate: bf16 on tensor cores, or float32 on the CUDA cores (PyTorch's
  default, no TF32). The body: 6 FLOP per non-embedding parameter (2 forward, 4 backward), in
  bf16; attention's sequence-length terms are left out.
* **Element-wise traffic**: bytes read and written per (token, vocabulary entry) by the passes
  over the logits tile, each pass one kernel reading and writing device memory (``ELEMENTWISE``
  lists them), plus the weight read by each GEMM and the float32 weight gradient read and
  written by each chunk's accumulation, per token: (bytes of W per GEMM · 3 + 8·H) / chunk.
  The scoring is log-probs and entropies forward, the log-probs' gradient backward (an
  entropy logged, not in the loss: TRL's default).
* **Time**: GEMM FLOPs at the datasheet's dense peak, plus the traffic at the memory bandwidth
  (the passes do not overlap the GEMMs: kernels one after another), against the body's FLOPs
  at the bf16 peak. Peaks are an upper bound on speed, so the times are lower bounds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results" / "figures-lm-head"

#: (name, hidden H, vocabulary V, non-embedding parameters: the models' cards)
MODELS = (
    ("Qwen3-0.6B", 1024, 151_936, 0.44e9),
    ("Qwen2.5-1.5B", 1536, 151_936, 1.31e9),
    ("Qwen2.5-7B", 3584, 152_064, 6.53e9),
)
#: NVIDIA's datasheets, SXM parts: dense bf16 tensor-core and float32 (non-tensor) TFLOP/s, and
#: memory bandwidth in TB/s (H100 and H200 have the same compute)
GPUS = {"H100 SXM": (989.0, 67.0, 3.35), "H200 SXM": (989.0, 67.0, 4.8)}

#: bytes per (token, vocabulary entry) of the element-wise passes over the tile, by head:
#: the GEMM writing the tile and each torch op reading/writing it (gmpo_core/lm_head.py's
#: forward and backward on a GPU, where a chunk's tile is one block), or TRL's Triton kernels
ELEMENTWISE = {
    "gmpo": {
        "forward": {
            "GEMM writes the float32 tile": 4,
            "amax": 4,
            "z - max": 8,
            "exp": 8,
            "sum": 4,
            "clamp (entropy)": 8,
            "exp·(z - max) (entropy)": 12,
            "sum (entropy)": 4,
        },
        "backward": {
            "GEMM writes the float32 tile": 4,
            "log p": 8,
            "exp, times -g": 16,
            "round into the half buffer": 6,
            "two GEMMs read it": 4,
        },
    },
    "gmpo, float32 backward": {
        "forward": {"as gmpo": 52},
        "backward": {
            "GEMM writes the float32 tile": 4,
            "log p": 8,
            "exp, times -g": 16,
            "two GEMMs read it": 8,
        },
    },
    "TRL 1.16": {
        "forward": {"GEMM writes the bf16 tile": 2, "one Triton pass reads it": 2},
        "backward": {"GEMM writes the bf16 tile": 2, "one Triton pass": 4, "two GEMMs read it": 4},
    },
    # gmpo_core/_triton_head.py: logits tiles in registers, ∂L/∂z written once for the GEMMs
    "gmpo fused (Triton)": {
        "forward": {"logits stay on chip (per-row statistics only)": 0},
        "backward": {"kernel recomputes the tile, writes bf16 ∂L/∂z": 2, "two GEMMs read it": 4},
    },
    # estimates from reading the kernels' code (not run here): verl's use_fused_kernels
    # (verl/utils/kernel/kernels.py) and Liger 0.8.5's CuTe SM90 kernel keep the forward's
    # logits on chip; their backward is counted as ours (∂L/∂z written once, read twice)
    "verl fused kernel": {
        "forward": {"logits stay on chip": 0},
        "backward": {"kernel writes bf16 ∂L/∂z": 2, "two GEMMs read it": 4},
    },
    "Liger 0.8.5 CuTe SM90": {
        "forward": {"logits stay on chip": 0},
        "backward": {"kernel writes bf16 ∂L/∂z": 2, "two GEMMs read it": 4},
    },
}
#: heads whose backward runs by vocabulary slices of all N tokens (gmpo_core/_triton_head.py):
#: W read 3 times (forward, recomputation, ∂L/∂h) and ∂L/∂W written once per N tokens, and per
#: slice of ``SLICE`` entries the float32 ∂L/∂h read and written and h read twice
SLICED = ("gmpo fused (Triton)", "verl fused kernel", "Liger 0.8.5 CuTe SM90")
#: vocabulary entries per slice: 256 MB of bf16 ∂L/∂z at N = 4096 (``_DZ_BYTES``)
SLICE = 32_768
#: head -> (tokens per chunk, bytes of the weight each GEMM reads per element, GEMM dtypes of
#: (forward + recomputation, the two gradient GEMMs))
HEADS = {
    "gmpo before (float32 GEMMs)": (256, 2 + 4 + 4, ("fp32", "fp32"), "gmpo, float32 backward"),
    "gmpo after, backward 'half' (default)": (256, 2, ("bf16", "bf16"), "gmpo"),
    "gmpo after, backward 'float32'": (256, 2, ("bf16", "fp32"), "gmpo, float32 backward"),
    "TRL 1.16 ChunkedLogProbFunction": (4096, 2, ("bf16", "bf16"), "TRL 1.16"),
    # N = 4096 tokens a call, as TRL's chunk
    "gmpo fused Triton (default on CUDA)": (4096, 2, ("bf16", "bf16"), "gmpo fused (Triton)"),
    "verl fused kernel (estimate)": (4096, 2, ("bf16", "bf16"), "verl fused kernel"),
    "Liger 0.8.5 CuTe SM90 (estimate)": (4096, 2, ("bf16", "bf16"), "Liger 0.8.5 CuTe SM90"),
}


def head_cost(h: int, v: int, head: str) -> dict[str, float]:
    """FLOPs by dtype and bytes per token of one head."""
    chunk, w_bytes, (logits, grads), passes = HEADS[head]
    flops = {"bf16": 0.0, "fp32": 0.0}
    flops[logits] += 4.0 * v * h  # the logits' GEMM and its recomputation
    flops[grads] += 4.0 * v * h  # ∂L/∂h and ∂L/∂W
    per_entry = sum(sum(p.values()) for p in ELEMENTWISE[passes].values())
    if passes in SLICED:  # W 3 reads and ∂L/∂W one write per call; ∂L/∂h and h per slice
        weight = (3 * w_bytes * h + 4 * h) / chunk + (8 * h + 2 * 2 * h) / SLICE
    else:  # per (token, entry): W reads, ∂L/∂W read+write, per chunk
        weight = (3 * w_bytes * h + 8 * h) / chunk
    return {**flops, "bytes": (per_entry + weight) * v}


TRL = "TRL 1.16 ChunkedLogProbFunction"


def _times(cost: dict[str, float], params: float, gpu: str) -> tuple[float, float, float]:
    """(body, head GEMMs, head traffic) nanoseconds per token at ``gpu``'s peaks."""
    bf16, fp32, bw = GPUS[gpu]
    body = 6 * params / (bf16 * 1e12) * 1e9
    gemm = (cost["bf16"] / (bf16 * 1e12) + cost["fp32"] / (fp32 * 1e12)) * 1e9
    return body, gemm, cost["bytes"] / (bw * 1e12) * 1e9


def table() -> tuple[str, dict[str, object]]:
    rows: dict[str, object] = {}
    lines = [
        "| model | H | V | head | GEMM GFLOP/token bf16 | fp32 | bytes per (token, entry) "
        "| traffic MB/token "
        "| GPU | body µs | head GEMMs µs | head traffic µs | head ÷ TRL's | head share of the step |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, h, v, params in MODELS:
        for head in HEADS:
            cost = head_cost(h, v, head)
            for gpu in GPUS:
                body, gemm, traffic = _times(cost, params, gpu)
                trl = sum(_times(head_cost(h, v, TRL), params, gpu)[1:])
                share = (gemm + traffic) / (body + gemm + traffic)
                rows[f"{name} | {head} | {gpu}"] = {
                    "gflop_bf16": cost["bf16"] / 1e9, "gflop_fp32": cost["fp32"] / 1e9,
                    "mb": cost["bytes"] / 1e6, "body_ns": body, "gemm_ns": gemm,
                    "traffic_ns": traffic, "share": share, "over_trl": (gemm + traffic) / trl,
                }  # fmt: skip
                lines.append(
                    f"| {name} | {h} | {v:,} | {head} | {cost['bf16'] / 1e9:.3f} "
                    f"| {cost['fp32'] / 1e9:.3f} | {cost['bytes'] / v:.0f} "
                    f"| {cost['bytes'] / 1e6:.1f} | {gpu} "
                    f"| {body / 1e3:.2f} | {gemm / 1e3:.2f} | {traffic / 1e3:.2f} "
                    f"| {(gemm + traffic) / trl:.2f}x | {share:.0%} |"
                )
    return "\n".join(lines), rows


def main() -> int:
    text, rows = table()
    rates = "; ".join(
        f"{g}: {b:g} TFLOP/s bf16 dense, {f:g} TFLOP/s float32, {bw:g} TB/s"
        for g, (b, f, bw) in GPUS.items()
    )
    md = "\n".join([
        "# The LM head's cost per training token on an H100/H200: a model, not a measurement",
        "",
        "Command: `python benchmarks/head_model.py`  ",
        f"Datasheet peaks used: {rates}. Body: 6 FLOP per non-embedding parameter in bf16 "
        "(attention's sequence terms left out). Head: 8VH GEMM FLOP per token (forward, "
        "recomputation, two gradient GEMMs); traffic: the element-wise passes per (token, "
        "vocabulary entry) and the weight's and its float32 gradient's traffic per chunk "
        "(benchmarks/head_model.py lists each pass). Times are lower bounds at the peaks.",
        "",
        text,
        "",
        "gmpo_trl's default (`GMPOConfig.gmpo_lm_head` unset) on CUDA with Triton is the fused "
        "head (its rows); without Triton, TRL's head (the TRL rows); `gmpo_lm_head=False` gives "
        "TRL's everywhere. The verl and Liger rows are estimates from reading their kernels' "
        "code, counted with our backward's structure.",
        "",
        "Element-wise bytes per (token, vocabulary entry), by pass:",
        "",
        "| head | pass | bytes |",
        "|---|---|---:|",
        *(f"| {head} | {step}: {name} | {b} |" for head, steps in ELEMENTWISE.items()
          for step, passes in steps.items() for name, b in passes.items()),
        "",
    ])  # fmt: skip
    print(md)
    if "--no-write" not in sys.argv:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "head_model.md").write_text(md)
        (RESULTS_DIR / "head_model.json").write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {RESULTS_DIR / 'head_model.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
