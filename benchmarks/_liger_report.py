"""bench_liger.py's report: its results as Markdown tables."""

from __future__ import annotations

from typing import Any

REF = "gmpo plain"
#: the columns that name a row's shape
ROW = ["dtype", "B", "V"]


def _cell(s: dict[str, float] | None) -> str:
    if s is None:
        return "—"
    return f"{s['median']:.3g} [{s['p20']:.3g}, {s['p80']:.3g}]"


def _mb(b: Any) -> str:
    return f"{b / 1e6:.0f}" if isinstance(b, (int, float)) else "—"


def _label(row: dict[str, Any]) -> str:
    return f"{row['dtype']} | {row['B']} | {row['V']:,}"


def _head(title: str, columns: list[str], paths: list[str]) -> list[str]:
    """A section's title and its table's header: ``columns``, then one column a path; every
    column right-aligned but the first."""
    return ["", title, "", "| " + " | ".join([*columns, *paths]) + " |",
            "|---|" + "---:|" * (len(columns) + len(paths) - 1)]  # fmt: skip


def markdown(result: dict[str, Any], env: list[str]) -> str:
    paths: list[str] = result["paths"]
    cuda = str(result["device"]).startswith("cuda")
    clock = "wall time between synchronizations" if cuda else "process CPU time (all threads)"
    rows: list[dict[str, Any]] = result["rows"]
    t, h = rows[0]["T"], rows[0]["H"]
    out = [
        "# The LM head and the loss fused: gmpo against Liger's GRPO loss",
        "",
        *env,
        f"- liger-kernel: {result['liger_kernel']}",
        f"- T {t}, H {h}; every token valid; on-policy old log-probs; no KL term",
        f"- clock: {clock}; {result['repeats']} calls per path after a warm-up call, the paths "
        "taking turns call by call",
        f"- rows measured: {len(rows)} of the {len(result['planned'])} planned "
        f"({', '.join(result['planned'])})",
        *_head(f"## Time per forward+backward, seconds: median [20th, 80th percentile] ({clock})",
               [*ROW, "threads"], paths),
    ]  # fmt: skip
    for row in rows:
        for n, r in row["timing"].items():
            if isinstance(r, str):
                out.append(f"| {_label(row)} | {n} | {r} |")
                continue
            key = "wall" if cuda else "cpu"
            cells = [_cell(r[key].get(p)) for p in paths]
            out.append(f"| {_label(row)} | {n} | " + " | ".join(cells) + " |")
    out += _head(f"## Time relative to {REF}: the path's median over {REF}'s (> 1: {REF} is faster)",
                 [*ROW, "threads"], [p for p in paths if p != REF])  # fmt: skip
    for row in rows:
        for n, r in row["timing"].items():
            if isinstance(r, str) or REF not in r["cpu"]:
                continue
            key = "wall" if cuda else "cpu"
            ref = r[key][REF]["median"]
            cells = [
                f"{r[key][p]['median'] / ref:.2f}x" if p in r[key] else "—"
                for p in paths
                if p != REF
            ]
            out.append(f"| {_label(row)} | {n} | " + " | ".join(cells) + " |")
    if any(row["memory"] for row in rows):
        how = (
            "torch.cuda.max_memory_allocated over the memory allocated before the call"
            if cuda
            else "VmHWM over VmRSS of one call in a fresh process per path, 1 thread"
        )
        out += _head(f"## Peak memory above the inputs, MB ({how}; both gradients included)", ROW,
                     paths)  # fmt: skip
        for row in rows:
            mem = row["memory"]
            cells = [
                _mb(mem.get(p)) if not isinstance(mem.get(p), str) else "failed" for p in paths
            ]
            out.append(f"| {_label(row)} | " + " | ".join(cells) + " |")
    out += [
        "",
        f"## Values against {REF} (from the warm-up calls)",
        "",
        f"Loss, and the largest |x − {REF}| / max |{REF}| of the hidden states' gradient and of "
        "every 97th row of the weight's gradient.",
        "",
        "| dtype | B | V | path | loss | grad hidden | grad weight (rows) |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        r = next((r for r in row["timing"].values() if isinstance(r, dict)), None)
        if r is None:
            continue
        for p, d in r["compare"].items():
            out.append(
                f"| {_label(row)} | {p} | {d['loss']:.7g} | {d['grad_hidden']:.1e} "
                f"| {d['grad_weight_rows']:.1e} |"
            )
    return "\n".join(out) + "\n"
