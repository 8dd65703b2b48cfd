"""The numbers docs/verl.md quotes, measured on CPU: ``make figures-verl``.

1. verl's trainer (``python -m verl.trainer.main_ppo``) end to end, as ``tests/verl/test_main_ppo.py``
   and ``examples/verl/smoke_test_cpu.sh`` run it (the helpers of ``verl_cpu/e2e.py``: the
   tiny Qwen2 model and the successor task, the smoke test's small off-policy steps, the CPU
   overrides): 3 steps of the default v1 trainer with ``loss_mode=gmpo``, then 3 steps of the
   legacy trainer (``trainer.use_v1=False``) with ``loss_mode=gmpo_dual_clip``.
2. verl's FSDP2 engine with its real actor loss (``verl_cpu/engine_worker.py`` under
   ``torchrun``, 1 and 2 processes, as ``tests/verl/test_engine.py`` launches it): the gradient
   norm of one global batch of 8 sequences split into 1, 2, 4 and dynamic-size micro-batches,
   for ``gmpo`` and verl's ``geo_mean``.

Writes results/figures-verl/verl_cpu.md (the step lines with the metrics the page shows, the grad norms) and
results/figures-verl/verl_cpu.json (every metric of every step, the full grad-norm reports). The logs stay in
the work folder (default runs/figures-verl).

    python -m verl_cpu.figures [--workdir runs/figures-verl] [--steps 3] [--skip-engine]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from verl_cpu import e2e as _e2e

ROOT = _e2e.REPO

#: the metrics each step line in the Markdown shows (the console logger prints some 80 a step)
SHOWN = (
    "training/rollout_probs_diff_max",
    *_e2e.GMPO_METRICS,
    "actor/pg_clipfrac_dual",
    "actor/pg_loss",
    "actor/grad_norm",
    "critic/score/mean",
    "timing_s/step",
)
RUNS = (  # name, trainer.use_v1, loss_mode
    ("v1", True, "gmpo"),
    ("v0", False, "gmpo_dual_clip"),
)
_PREFIXED_STEP = re.compile(r"^(\(\w+)(?: pid=\d+)?(\) )(step:\d+ - .*)$")
_SYNC = re.compile(r"^\((\w+)(?: pid=\d+)?\) (hf rollout: weights synced .*)$")
ENGINE_MODES = ("gmpo", "geo_mean")


def shown_line(raw: str) -> str:
    """A console step line, Ray's pid dropped, with only the SHOWN metrics (raw text kept)."""
    m = _PREFIXED_STEP.match(raw.strip())
    prefix, line = (m.group(1) + m.group(2), m.group(3)) if m else ("", raw.strip())
    head, *items = line.split(" - ")
    kept = {k.strip(): item for item in items if (k := item.partition(":")[0]).strip() in SHOWN}
    return prefix + " - ".join([head, *(kept[k] for k in SHOWN if k in kept)])


def trainer_run(files: dict[str, Path], workdir: Path, v1: bool, loss_mode: str, steps: int):  # type: ignore[no-untyped-def]
    workdir.mkdir(parents=True, exist_ok=True)
    args = _e2e.overrides(files, workdir, v1=v1, loss_mode=loss_mode, steps=steps)
    start = time.monotonic()
    returncode, log = _e2e.run(workdir, args, timeout=1800)
    wall = time.monotonic() - start
    (workdir / "log.txt").write_text(log)
    if returncode != 0:
        tail = _e2e.plain(log)[-6000:]
        raise SystemExit(
            f"verl's trainer ({loss_mode}, use_v1={v1}) failed ({returncode}):\n{tail}"
        )
    clean = [line.strip() for line in _e2e.plain(log).splitlines()]
    raw_steps = [line for line in clean if _PREFIXED_STEP.match(line) or line.startswith("step:")]
    syncs = [f"({m.group(1)}) {m.group(2)}" for line in clean if (m := _SYNC.match(line))]
    metrics = _e2e.step_metrics(log)
    if sorted(metrics) != list(range(1, steps + 1)):
        raise SystemExit(
            f"expected steps 1..{steps} in {workdir / 'log.txt'}, got {sorted(metrics)}"
        )
    return {
        "trainer.use_v1": v1,
        "loss_mode": loss_mode,
        "wall_s": wall,
        "metrics_per_step": [len(metrics[s]) for s in sorted(metrics)],
        "step_lines": [shown_line(line) for line in raw_steps],
        "syncs": syncs,
        "metrics": {str(s): metrics[s] for s in sorted(metrics)},
        "log": os.path.relpath(workdir / "log.txt", ROOT),
    }


def engine_run(workdir: Path, nproc: int, *args: str) -> dict[str, Any]:
    """``torchrun --nproc_per_node NPROC engine_worker.py`` (``_e2e.launch_engine``, as
    test_engine.py runs it), waited for; its JSON report."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc, out = _e2e.launch_engine(nproc, workdir, *args)
    try:
        log, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (workdir / "log.txt").write_text(log)
    if proc.returncode != 0:
        raise SystemExit(f"torchrun with {nproc} process(es) failed:\n{log[-6000:]}")
    return json.loads(out.read_text())


def engine_runs(workdir: Path) -> dict[str, Any]:
    modes = ["--loss-modes", *ENGINE_MODES]
    split = ["--dynamic-tokens", "24", "--micro"]  # 24 tokens: 3 uneven micro-batches of 8 rows
    return {
        "1": engine_run(workdir / "dp1", 1, *modes, *split, "1", "2", "4"),
        "2": engine_run(workdir / "dp2", 2, *modes, *split, "1", "2", "4"),
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for name in ("verl", "torch", "transformers", "ray", "gmpo"):
        try:
            out[name] = version(name)
        except Exception:
            out[name] = "?"
    return out


def markdown(report: dict[str, Any]) -> str:
    v = report["versions"]
    lines = [
        f"# verl's trainer and engine on CPU ({report['date']})",
        "",
        f"`{report['command']}` (verl_cpu/figures.py). {report['cpus']} CPUs, "
        f"`GMPO_VERL_IMPL={report['gmpo_verl_impl']}`; verl {v['verl']}, torch {v['torch']}, "
        f"transformers {v['transformers']}, ray {v['ray']}.",
        "",
        "## verl's trainer (`python -m verl.trainer.main_ppo`)",
        "",
        "The tiny task of verl_cpu/e2e.py (a random Qwen2 model, the successor task), "
        f"{report['steps']} steps of 4 prompts x 4 samples, 2 mini-batches x 2 epochs, float32, "
        "the `hf` rollout. Each step line shows these of the console logger's metrics: "
        + ", ".join(f"`{k}`" for k in SHOWN)
        + ".",
        "",
    ]
    for name, run in report["trainer"].items():
        title = "default v1 trainer" if run["trainer.use_v1"] else "legacy trainer"
        lines += [
            f"### {name}: {title}, `trainer.use_v1={run['trainer.use_v1']}`, "
            f"`loss_mode={run['loss_mode']}`",
            "",
            f"Wall time of the whole run (Ray start to exit): {run['wall_s']:.1f} s; metrics "
            f"per step line: {', '.join(map(str, run['metrics_per_step']))}.",
            "",
            "```text",
        ]
        syncs = iter(run["syncs"])
        for line in run["step_lines"]:
            if (sync := next(syncs, None)) is not None:
                lines.append(sync)
            lines.append(line)
        lines += [
            "```",
            "",
            "| step | " + " | ".join(k.removeprefix("actor/") for k in SHOWN) + " |",
        ]
        lines.append("|---:|" + "---:|" * len(SHOWN))
        for step, metrics in run["metrics"].items():
            cells = [repr(metrics[k]) if k in metrics else "" for k in SHOWN]
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
        lines.append("")
    if report.get("engine"):
        lines += [
            "## verl's FSDP2 engine: the gradient norm of one global batch",
            "",
            "verl_cpu/engine_worker.py under `torchrun` (gloo), as tests/verl/test_engine.py "
            "runs it: 8 sequences (one fully masked, rollout weights, one of them 0), bf16, "
            "split into 1, 2 or 4 micro-batches per rank or into verl's dynamic-size ones "
            "(at most 24 tokens each).",
            "",
            "| ranks | loss_mode | " + " | ".join(report["engine_splits"]) + " |",
            "|---:|---|" + "---:|" * len(report["engine_splits"]),
        ]
        for world, res in report["engine"].items():
            for mode in ENGINE_MODES:
                norms = [res["grad_norm"].get(f"{mode}/{s}") for s in report["engine_splits"]]
                cells = ["" if n is None else f"{n:.6f}" for n in norms]
                lines.append(f"| {world} | {mode} | " + " | ".join(cells) + " |")
        spread = report["gmpo_grad_norm_spread"]
        lines += [
            "",
            f"gmpo's grad norms over every split and rank count: {spread['min']:.6f} to "
            f"{spread['max']:.6f}, a relative spread of {spread['relative']:.2g}.",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "figures-verl")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "figures-verl" / "verl_cpu")
    args = parser.parse_args(argv)

    workdir = args.workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    report: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "make figures-verl",
        "cpus": os.cpu_count(),
        "gmpo_verl_impl": os.environ.get("GMPO_VERL_IMPL", "plain"),
        "versions": versions(),
        "steps": args.steps,
        "trainer": {},
    }
    files = _e2e.prepare(workdir / "files")
    for name, v1, loss_mode in RUNS:
        print(f"verl_cpu: {args.steps} steps, use_v1={v1}, loss_mode={loss_mode}", flush=True)
        report["trainer"][name] = trainer_run(files, workdir / name, v1, loss_mode, args.steps)
        for line in report["trainer"][name]["step_lines"]:
            print("  ", line[:200], flush=True)
    if not args.skip_engine:
        print("verl_cpu: engine grad norms, torchrun with 1 and 2 processes", flush=True)
        report["engine"] = engine_runs(workdir / "engine")
        report["engine_splits"] = ["1", "2", "4", "dynamic"]
        gmpo = [
            n for res in report["engine"].values()
            for k, n in res["grad_norm"].items() if k.startswith("gmpo/")
        ]  # fmt: skip
        report["gmpo_grad_norm_spread"] = {
            "min": min(gmpo),
            "max": max(gmpo),
            "relative": (max(gmpo) - min(gmpo)) / min(gmpo),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(f"verl_cpu: wrote {args.out.with_suffix('.md')} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
