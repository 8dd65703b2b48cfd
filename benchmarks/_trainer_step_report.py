"""bench_trainer_step.py's report: the per-variant medians, the table and the verdict."""

from __future__ import annotations

import statistics
from typing import Any


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:,.0f}"


def _mb(b: float | None) -> str:
    return "—" if b is None else f"{b / 1e6:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def summarize(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per phase and variant: median time, range, largest peak."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for phase in ("loss_step", "train_step"):
        for v, r in results.items():
            rec = r.get(phase)
            if not rec or not rec["seconds"]:
                continue
            row = {
                "median_s": _median(rec["seconds"]),
                "min_s": min(rec["seconds"]),
                "max_s": max(rec["seconds"]),
                "peak_extra_bytes": max(rec["peak_extra_bytes"]),
                "n": len(rec["seconds"]),
            }
            if phase == "loss_step":
                row["forward_median_s"] = _median(rec["forward_seconds"])
                row["backward_median_s"] = _median(rec["backward_seconds"])
            out.setdefault(phase, {})[v] = row
    return out


def table(summary: dict[str, dict[str, dict[str, Any]]], labels: dict[str, str]) -> str:
    lines = [
        "| step | LM head | time ms (median) | range ms | forward / backward ms "
        "| peak extra MB | time ÷ TRL head | peak ÷ TRL head |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"loss_step": "loss step", "train_step": "train step"}
    for phase, rows in summary.items():
        ref = rows.get("trl")
        for v, row in rows.items():
            fb = (
                f"{_ms(row['forward_median_s'])} / {_ms(row['backward_median_s'])}"
                if "forward_median_s" in row
                else "—"
            )
            lines.append(
                f"| {names[phase]} | {labels[v]} | {_ms(row['median_s'])} "
                f"| {_ms(row['min_s'])}–{_ms(row['max_s'])} | {fb} "
                f"| {_mb(row['peak_extra_bytes'])} "
                f"| {_ratio(row['median_s'], ref and ref['median_s'])} "
                f"| {_ratio(row['peak_extra_bytes'], ref and ref['peak_extra_bytes'])} |"
            )
    return "\n".join(lines)


def verdict(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    rows = summary.get("loss_step", {})
    if "trl" not in rows or "gmpo" not in rows:
        return {}
    t, g = rows["trl"], rows["gmpo"]
    out: dict[str, Any] = {
        "loss_step_time_ratio": g["median_s"] / t["median_s"],
        "loss_step_peak_ratio": g["peak_extra_bytes"] / t["peak_extra_bytes"],
    }
    out["faster"] = out["loss_step_time_ratio"] < 1.0
    out["leaner"] = out["loss_step_peak_ratio"] < 1.0
    train = summary.get("train_step", {})
    if "trl" in train and "gmpo" in train:
        out["train_step_time_ratio"] = train["gmpo"]["median_s"] / train["trl"]["median_s"]
        out["train_step_peak_ratio"] = (
            train["gmpo"]["peak_extra_bytes"] / train["trl"]["peak_extra_bytes"]
        )
        out["faster"] = out["faster"] and out["train_step_time_ratio"] < 1.0
        out["leaner"] = out["leaner"] and out["train_step_peak_ratio"] < 1.0
    out["faster_and_leaner"] = out["faster"] and out["leaner"]
    return out


# --------------------------------------------------------------------------------------------
# real-model mode (--model): three trainers, whole steps

REAL_LABELS = {
    "gmpo": "gmpo_trl GMPOTrainer (defaults: gmpo_lm_head=True)",
    "grpo": "trl GRPOTrainer (loss_type {loss_type})",
    "trl_gmpo": "trl.experimental.gmpo GMPOTrainer",
}
PHASES = ("scoring", "forward", "backward", "optimizer")


def real_label(variant: str, result: dict[str, Any]) -> str:
    return REAL_LABELS[variant].format(loss_type=result.get("loss_type"))


def real_summary(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per case and trainer: the median step and its phases, the LM head's time and share (per
    step, then the median), the largest peaks, and the ratios to gmpo's in the same case."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, by_variant in results.items():
        rows = out.setdefault(key, {})
        for v, r in by_variant.items():
            st, row = r["step"], {}
            for kind in ("cpu", "wall"):
                steps = st[f"{kind}_seconds"]
                head = [sum(h.values()) for h in st[f"head_{kind}_seconds"]]
                row[kind] = {
                    "median_s": _median(steps),
                    "min_s": min(steps),
                    "max_s": max(steps),
                    "phases_median_s": {
                        ph: _median([x[ph] for x in st[f"{kind}_phases"]]) for ph in PHASES
                    },
                    "head_median_s": _median(head),
                    "head_phases_median_s": {
                        ph: _median([h.get(ph, 0.0) for h in st[f"head_{kind}_seconds"]])
                        for ph in ("scoring", "forward", "backward")
                    },
                    "head_share": _median([h / s for h, s in zip(head, steps, strict=True)]),
                    # the rest of the step: the body, the loss, the optimizer
                    "rest_median_s": _median([s - h for h, s in zip(head, steps, strict=True)]),
                }
            row["n"] = len(st["cpu_seconds"])
            row["peak_rss_bytes"] = max(st["peak_rss_bytes"])
            row["peak_extra_bytes"] = max(st["peak_extra_bytes"])
            rows[v] = row
        ref = rows.get("gmpo")
        for row in rows.values():
            row["cpu_time_vs_gmpo"] = ref and row["cpu"]["median_s"] / ref["cpu"]["median_s"]
            row["wall_time_vs_gmpo"] = ref and row["wall"]["median_s"] / ref["wall"]["median_s"]
            row["peak_rss_vs_gmpo"] = ref and row["peak_rss_bytes"] / ref["peak_rss_bytes"]
    return out


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}"


def _x(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def real_table(
    summary: dict[str, dict[str, dict[str, Any]]], results: dict[str, dict[str, Any]]
) -> str:
    lines = [
        "| precision | rows × tokens | trainer | CPU s/step (median) | CPU range s "
        "| wall s/step (median) | scoring / forward / backward / optimizer CPU s "
        "| LM head CPU s | head share | rest of the step CPU s | peak RSS MB | peak extra MB "
        "| CPU time ÷ gmpo | peak RSS ÷ gmpo |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, rows in summary.items():
        precision, shape = key.split(":")
        for v, row in rows.items():
            cpu = row["cpu"]
            ph = cpu["phases_median_s"]
            lines.append(
                f"| {precision} | {shape.replace('x', ' × ')} | {real_label(v, results[key][v])} "
                f"| {_s(cpu['median_s'])} | {_s(cpu['min_s'])}–{_s(cpu['max_s'])} "
                f"| {_s(row['wall']['median_s'])} "
                f"| {' / '.join(_s(ph[p]) for p in PHASES)} | {_s(cpu['head_median_s'])} "
                f"| {100 * cpu['head_share']:.1f} % | {_s(cpu['rest_median_s'])} "
                f"| {_mb(row['peak_rss_bytes'])} "
                f"| {_mb(row['peak_extra_bytes'])} | {_x(row['cpu_time_vs_gmpo'])} "
                f"| {_x(row['peak_rss_vs_gmpo'])} |"
            )
    return "\n".join(lines)


def _by_dtype(counts: dict[str, float] | None, fmt: str) -> str:
    if not counts:
        return "—"
    return ", ".join(
        f"{format(n, fmt) if n >= 0.05 else format(n, '.1g')} {dt}"
        for dt, n in sorted(counts.items(), key=lambda kv: -kv[1])
    )


def census_table(results: dict[str, dict[str, Any]]) -> str:
    """What ran in which dtype in the first warmup step (a dispatch mode under autocast)."""
    lines = [
        "| precision | rows × tokens | trainer | LM head: input, weight, autocast inside "
        "| head GEMMs GFLOP | other GEMMs GFLOP | attention kernel calls |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for key, by_variant in results.items():
        precision, shape = key.split(":")
        for v, r in by_variant.items():
            c, seen = r["dtype_census"], r["head_seen"]
            attention: dict[str, float] = {}
            for name, counts in c.items():
                if name.endswith(" calls"):
                    for dt, n in counts.items():
                        attention[dt] = attention.get(dt, 0) + n
            inside = (
                f"{seen['function']}: {seen['hidden_dtype'].replace('torch.', '')}, "
                f"{seen['weight_dtype'].replace('torch.', '')}, "
                + (
                    f"autocast {seen['autocast_dtype'].replace('torch.', '')}"
                    if seen["autocast"]
                    else "no autocast"
                )
            )
            lines.append(
                f"| {precision} | {shape.replace('x', ' × ')} | {real_label(v, r)} | {inside} "
                f"| {_by_dtype(c.get('head GEMM GFLOP'), ',.1f')} "
                f"| {_by_dtype(c.get('other GEMM GFLOP'), ',.1f')} "
                f"| {_by_dtype(attention, '.0f')} |"
            )
    return "\n".join(lines)


def real_markdown(
    meta: dict[str, Any],
    results: dict[str, dict[str, Any]],
    summary: dict[str, dict[str, dict[str, Any]]],
    agreement: dict[str, Any],
) -> str:
    first = next(iter(next(iter(results.values())).values()))
    cfg = first["model_config"]

    def state(commit: str, dirty: list[str] | str) -> str:
        if isinstance(dirty, str):
            return f"`{commit}` (uncommitted changes {dirty})"
        return f"`{commit}`" + (f" with uncommitted changes in {', '.join(dirty)}" if dirty else "")

    end = meta["commit_at_end"]
    moved = end["commit"] != meta["commit"] or end["uncommitted_code"] != meta["uncommitted_code"]
    checked, flags = meta["cpu_flags"]["checked"], ", ".join(meta["cpu_flags"]["present"])
    lines = [
        f"# One trainer step on a real model: gmpo_trl against TRL's trainers ({meta['date_utc']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Run from {meta['date_utc']} to {meta['finished_utc']} at commit "
        + state(meta["commit_short"], meta["uncommitted_code"])
        + (
            f"; at the end the checkout was at {state(end['commit_short'], end['uncommitted_code'])}"
            " (other work in the same checkout)"
            if moved
            else ""
        )
        + f"; torch {meta['torch']}, trl {meta['trl']}, transformers {meta['transformers']}, "
        f"accelerate {meta['accelerate']}, Python {meta['python']}; {meta['threads']} torch "
        f"thread(s) on {meta['cpu']} (of {', '.join(checked)}: {flags or 'none'}); load average "
        f"{meta['load_average_start']} at the start, {meta['load_average_end']} at the end "
        f"(each child's below). Total {meta['wall_s']:.0f} s.",
        "",
        *([f"Note: {meta['note']}", ""] if meta.get("note") else []),
        f"Model: `{meta['model']}`, {cfg['architecture']}, {first['params']:,} parameters, "
        f"vocabulary {cfg['vocab_size']:,}, hidden {cfg['hidden_size']}, "
        f"{cfg['num_hidden_layers']} layers, tied embeddings {cfg['tie_word_embeddings']}, "
        "weights float32 (the same initial weights in every child).",
        "",
        "Batch: chat_chain_sum's chat prompts (the model's chat template, left-padded), each "
        "prompt's rows one group of generations, and a fixed reply per prompt (sentences around "
        "the answer, then EOS; cut at the completion length, right-padded); one N(0, 1) advantage "
        "per row; the same batch in every child of a case:",
        "",
        "| case | rows | prompts × generations | prompt tokens | completion tokens "
        "| valid completion tokens | positions scored per pass | timed steps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in meta["cases"]:
        r = next(iter(results[case["key"]].values()))
        lines.append(
            f"| {case['key']} | {case['rows']} | {case['rows'] // case['generations']} × "
            f"{case['generations']} | {r['prompt_tokens']} | {case['tokens']} "
            f"| {r['completion_tokens_valid']} "
            f"| {case['rows'] * (r['positions_per_row'] - 1):,} | {case['repeats']} |"
        )
    lines += [
        "",
        "Step (one fresh process per trainer and case, after "
        f"{meta['warmup']} warmup step(s); the median of the timed steps): **scoring**, "
        "the old log-probs, `trainer._get_per_token_logps_and_entropies` under `torch.no_grad()` "
        "as GRPOTrainer calls it when `num_iterations` > 1 (the chat tasks' 2); **forward**, "
        "`trainer.compute_loss` (the scoring forward with gradients and entropies, the loss, its "
        "metrics); **backward**, `trainer.accelerator.backward(loss)`; **optimizer**, "
        "`accelerator.clip_grad_norm_` (max_grad_norm "
        f"{first['max_grad_norm']}), the trainer's optimizer step ({first['optimizer']}) and "
        "`zero_grad`. Generation and rewards are not part of it. Trainer settings: "
        f"gmpo_tasks.chat_chain_sum's `trainer_args` (learning rate {first['learning_rate']:g}, "
        f"num_iterations {first['num_iterations']}) with `use_cpu=True`, and `bf16=True` for the "
        "bf16 cases (accelerate's CPU autocast to bfloat16 around the model's forward; the "
        "weights, gradients and optimizer state stay float32).",
        "",
        "Time: the process's CPU time (one torch thread: the step's own work, which other "
        "processes on the same cores do not inflate), and the wall time beside it (which they "
        "do). LM head: time inside the head, measured: every call of TRL's "
        "`ChunkedLogProbFunction.apply` (GRPOTrainer's fused forward: lm_head, log-softmax and "
        "entropy in vocabulary tiles) or of gmpo_core's `token_logprobs` (gmpo_trl with "
        "`gmpo_lm_head=True`) is timed, and its backward by hooks before and after its autograd "
        "node (the CPU engine runs one node at a time on the calling thread); share = head CPU "
        "time / step CPU time per step, then the median. Peak RSS: VmHWM over the step after `echo 5 > "
        "/proc/self/clear_refs` (weights, gradients, optimizer state and autocast's bf16 weight "
        "copies included); peak extra: VmHWM minus VmRSS before the step (after `gc.collect()` "
        "and `malloc_trim(0)`); the largest over the timed steps; child env "
        f"`{' '.join(f'{k}={v}' for k, v in meta['child_env'].items())}`. MB = 10⁶ bytes.",
        "",
        real_table(summary, results),
        "",
        "What ran in which dtype (the first warmup step, counted by a torch dispatch mode below "
        "autocast: GEMM GFLOP in and out of the LM head, its backward included, and the "
        "attention kernels' calls, by the dtype of their inputs):",
        "",
        census_table(results),
        "",
    ]
    lines.append(
        "bf16 against float32, and same batch, same weights: the first warmup step's scoring "
        "pass (the initial weights), max |Δ| of the per-token log-probs over the valid "
        "completion tokens."
    )
    lines.append("")
    for key, rows in summary.items():
        precision, shape = key.split(":")
        f32 = summary.get(f"float32:{shape}")
        if precision == "bf16" and f32:
            lines.append(
                f"- {key}, CPU time per step ÷ float32's at the same shape: "
                + ", ".join(
                    f"{v} {row['cpu']['median_s'] / f32[v]['cpu']['median_s']:.2f}×"
                    for v, row in rows.items()
                    if v in f32
                )
                + "."
            )
    for key, diffs in agreement["against_gmpo"].items():
        lines.append(
            f"- {key}, against gmpo's: " + ", ".join(f"{v} {d:.2e}" for v, d in diffs.items()) + "."
        )
    for key, diffs in agreement["bf16_against_float32"].items():
        lines.append(
            f"- {key} against float32 at the same shape: "
            + ", ".join(
                f"{v} max {d['max_abs']:.2e} (mean {d['mean_abs']:.2e})" for v, d in diffs.items()
            )
            + "."
        )
    for key, losses in agreement["warmup_loss"].items():
        lines.append(
            f"- {key}, loss of that step: "
            + ", ".join(f"{v} {x:.6g}" for v, x in losses.items())
            + "."
        )
    lines += [
        "",
        "Each child: setup (model, tokenizer, trainer) and wall time, load average at its start "
        "and end.",
        "",
        "| case | trainer | setup s | child wall s | load at start | load at end |",
        "|---|---|---:|---:|---|---|",
    ]
    for key, by_variant in results.items():
        for v, r in by_variant.items():
            lines.append(
                f"| {key} | {v} | {r['setup_s']:.1f} | {r['child_wall_s']:.0f} "
                f"| {r['load_start']} | {r['load_end']} |"
            )
    lines.append("")
    return "\n".join(lines)
