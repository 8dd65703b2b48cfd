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
