"""One run of the off-policy study on the real model, in a process of its own, and its record.

    python -m studies.offpolicy one --loss gmpo --lr 2e-05 --seed 8100 --updates 4 \\
        --out runs/offpolicy/real/grid/gmpo_lr2e-05_seed8100 [--task chat_arith] [-- gmpo flags]

The run is one side of ``gmpo compare --task TASK --against dapo_trl`` (the same parse and plan,
:func:`gmpo_trl.cli.compare.compare_plan`): ``gmpo`` trains GMPO with ``GMPOTrainer``, ``dapo_trl``
trains TRL's own ``GRPOTrainer`` with TRL's default loss (``loss_type="dapo"``, ``epsilon`` 0.2,
``epsilon_high`` unset), each at ``--lr`` (constant). The regime's flags come from the task's own
generation batch and number of generations (:func:`~studies.offpolicy.design.regime_flags`).

The run's outputs go to ``--out``; its record, ``record.json``, is written last and whole
(:func:`studies.stability.files.write_atomic`): a run killed before it leaves no record, and a
record is what counts as finished.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from studies.offpolicy.design import AGAINST, CLIP_KEY, GMPO, LOSSES, TASK, regime_flags
from studies.stability.files import write_atomic

#: logged per optimizer step by both trainers: the share of tokens the clip acted on, the
#: policy's entropy, the completions' mean length, and the token log-ratio extremes
CURVE_KEYS = {"reward": "reward", "clip": "clip_ratio/region_mean", "entropy": "entropy",
              "length": "completions/mean_length", "lo": "log_ratio/min", "hi": "log_ratio/max"}  # fmt: skip


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def curves(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per logged optimizer step: its step and each of :data:`CURVE_KEYS` (None where the step
    did not log it), rounded to 6 significant digits."""
    out: dict[str, list[Any]] = {"step": [r["step"] for r in rows]}
    for name, key in CURVE_KEYS.items():
        out[name] = [None if (v := _num(r.get(key))) is None else float(f"{v:.6g}") for r in rows]
    return out


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def summarize(c: dict[str, list[Any]]) -> dict[str, Any]:
    """A run's descriptive numbers from its :func:`curves`: the training reward's area under
    the curve (the mean of the logged rewards, one a generation), the clipped fraction (its mean
    over the off-policy steps and its largest), the token log-ratio spread (max - min per
    off-policy step, then the mean), the entropy and the completions' length (means over every
    logged step). An off-policy step is one whose log-ratio extremes are not both 0."""
    off = [i for i, (lo, hi) in enumerate(zip(c["lo"], c["hi"], strict=True))
           if lo is not None and hi is not None and (lo != 0 or hi != 0)]  # fmt: skip
    clips = [x for x in c["clip"] if x is not None]
    return {
        "reward_auc": _mean(c["reward"]),
        "clipped_fraction_mean": _mean([c["clip"][i] for i in off]) if off else 0.0,
        CLIP_KEY: max(clips) if clips else None,
        "spread_mean": _mean([c["hi"][i] - c["lo"][i] for i in off]) if off else 0.0,
        "off_policy_steps": len(off),
        "entropy_mean": _mean(c["entropy"]),
        "length_mean": _mean(c["length"]),
    }


def record_of(args: argparse.Namespace, flags: list[str], summary: dict[str, Any],
              rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:  # fmt: skip
    """The run's record: what ran, its held-out rewards (``None`` where the task has no held-out
    split), its summary and its curves."""
    c = curves(rows)
    held = {k: summary.get(k) for k in ("held_out_reward_before", "held_out_reward_after",
                                        "held_out_right_before", "held_out_right_after",
                                        "held_out_completions")}  # fmt: skip
    return {"task": args.task, "loss": args.loss, "lr": args.lr, "seed": args.seed,
            "updates": args.updates, "flags": flags, "extra": args.extra, "wall_s": wall_s,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "optimizer_steps": summary["optimizer_steps"],
            "reward_first": summary.get("reward_first"), "reward_final": summary.get("reward_final"),
            **held, **summarize(c), "curves": c}  # fmt: skip


def generation_shape(parsed: Any) -> tuple[int, int]:
    """``(completions a generation batch, generations)`` of a parsed command line's defaults."""
    from gmpo_trl import GMPOConfig

    config = parsed.config(GMPOConfig)
    if config.gradient_accumulation_steps != 1:
        raise SystemExit("the regimes count one optimizer step a minibatch: no accumulation")
    updates = config.steps_per_generation * config.num_iterations
    return config.generation_batch_size, config.max_steps // updates


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train the run, write its record; returns it."""
    from gmpo_trl import GMPOTrainer
    from gmpo_trl.cli.compare import compare_plan
    from gmpo_trl.cli.parsing import parse
    from gmpo_trl.cli.runs import interruptible, stop_if_interrupted
    from gmpo_trl.cli.runs import run as run_plan
    from gmpo_trl.grpo_range import RangeLoggingGRPOTrainer

    base = ["--task", args.task, "--against", AGAINST, "--output_dir", str(args.out)]
    flags = regime_flags(args.updates, *generation_shape(parse("compare", base)))  # the task's
    argv = [*base, "--seed", str(args.seed), "--learning_rate", repr(args.lr),
            "--lr_scheduler_type", "constant", "--disable_tqdm", "true", *flags, *args.extra]  # fmt: skip
    plan = compare_plan(parse("compare", argv))
    config = plan.config if args.loss == GMPO else plan.comparators[AGAINST]
    cls = GMPOTrainer if args.loss == GMPO else RangeLoggingGRPOTrainer
    title = f"offpolicy ({args.loss}, lr {args.lr!r}, seed {args.seed}, {args.updates} updates)"
    done = run_plan(plan, config, interruptible(cls), title)
    stop_if_interrupted(done, config.output_dir)
    record = record_of(args, flags, done.summary, done.rows, time.time() - args.started)
    write_atomic(Path(args.out) / "record.json", json.dumps(record, indent=1) + "\n")
    return record


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.offpolicy one",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--task", default=TASK)
    p.add_argument("--loss", choices=LOSSES, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--updates", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--started", type=float, default=None,
                   help="the run's start (time.time()) as its launcher took it; default: now")  # fmt: skip
    return p


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    if args.started is None:
        args.started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
