"""The off-policy study's planned analysis (docs/offpolicy_plan.md), from the committed records
under ``results/offpolicy/``: the primary row (GMPO minus ``dapo_trl`` on the held-out reward
after training, 4 updates, each loss at its own rate, the seed as the unit, the seeds where the
clip acted in both runs), its verdict by the MDE; each run's clipped fraction and spread; the
secondary rows; the 1-update arm; and the tiny model's ``chain_sum`` family. Writes
``offpolicy.json`` and ``offpolicy.md``."""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from gmpo_stats.paired import holm
from studies.offpolicy.design import (
    AGAINST,
    ENDPOINT,
    GMPO,
    GRID_SEEDS,
    LOSSES,
    SPARE_SEEDS,
    TINY_REGIMES,
    clip_acted,
    counted,
    margin,
    mde,
    verdict,
)
from studies.offpolicy.real import records
from studies.stability.updates_analysis import verdict as tiny_verdict
from studies.stability.updates_plan import has_records, records_of, regime_name
from studies.stability.which_loss import _test_rows, compare

#: the secondary rows: (record key, the direction in which GMPO is "better", its name)
SECONDARY = (("reward_auc", +1, "training reward, area under the curve"),
             ("spread_mean", -1, "token log-ratio spread (narrower)"),
             ("entropy_mean", +1, "entropy"), ("length_mean", +1, "completion length"))  # fmt: skip


def as_cells(rs: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """The records of ``seeds`` as one cell for :func:`~studies.stability.which_loss.compare`:
    each loss at its own rate (``own_lr``), the seed as the unit."""
    keep = set(seeds)
    return [{**r, "variant": r["loss"], "own_lr": r["lr"], "lr": 0.0, "grad_clip": None}
            for r in rs if r["seed"] in keep]  # fmt: skip


def primary(grid: list[dict[str, Any]], rates: dict[str, Any]) -> dict[str, Any]:
    """The primary row on the first :data:`GRID_SEEDS`-many seeds that count (grid seeds, then
    spares), its MDE at that number of seeds (the pilot's paired SD) and its verdict."""
    ok, excluded = counted(grid, GRID_SEEDS + SPARE_SEEDS)
    ok = ok[: len(GRID_SEEDS)]
    t = compare(as_cells(grid, ok), AGAINST, ENDPOINT)
    d = mde(rates["paired_sd"], len(ok)) if ok else float("nan")
    t.update(counted=ok, excluded=excluded, mde=d, margin=margin(d), verdict=verdict(t, d),
             name=f"{GMPO} vs {AGAINST}, held-out reward", holm=t["p"])  # fmt: skip
    return t


def mechanism(grid: list[dict[str, Any]], seeds: list[int]) -> dict[str, dict[str, Any]]:
    """Per loss over the counted seeds' runs: the clipped fraction (mean over off-policy steps,
    then its mean, least and largest over runs) and the spread, entropy and length means."""
    out = {}
    for loss in LOSSES:
        rs = [r for r in grid if r["loss"] == loss and r["seed"] in set(seeds)]
        if rs:
            cf = [r["clipped_fraction_mean"] for r in rs]
            out[loss] = {"runs": len(rs), "clipped_mean": statistics.fmean(cf),
                         "clipped_min": min(cf), "clipped_max": max(cf),
                         **{k: statistics.fmean(r[k] for r in rs)
                            for k in ("spread_mean", "entropy_mean", "length_mean",
                                      "reward_auc", ENDPOINT)}}  # fmt: skip
    return out


def secondary(grid: list[dict[str, Any]], seeds: list[int]) -> dict[str, dict[str, Any]]:
    tests = {f"{GMPO} vs {AGAINST}, {name}": compare(as_cells(grid, seeds), AGAINST, key, sign)
             for key, sign, name in SECONDARY}  # fmt: skip
    for (name, t), adj in zip(tests.items(), holm([t["p"] for t in tests.values()]), strict=True):
        t.update(name=name, holm=adj)
    return tests


def tiny(results: Any) -> dict[str, dict[str, Any]]:
    """chain_sum's family: per regime, GMPO against ``dapo_trl`` on the final reward at each
    loss's pilot rate; at 2 or more updates a seed counts only where the clip acted in both runs
    (``clipped_fraction_mean`` above 0); Holm over the regimes; the regime study's verdict."""
    pilot = json.loads((results / "tiny" / "pilot.json").read_text())
    tests = {}
    for u in TINY_REGIMES:
        d = results / "tiny" / "grid" / regime_name(u)
        if not has_records(d):
            continue
        rates = pilot["regimes"][regime_name(u)]["rates"]
        rs = [r for r in records_of(d) if r["lr"] == rates.get(r["variant"])]
        acted = {(r["variant"], r["seed"]): r["clipped_fraction_mean"] > 0 for r in rs}
        seeds = sorted({r["seed"] for r in rs})
        keep = [s for s in seeds if u == 1 or all(acted.get((v, s), False) for v in LOSSES)]
        cells = [{**r, "own_lr": r["lr"], "lr": 0.0} for r in rs if r["seed"] in keep]
        t = compare(cells, AGAINST, "final_reward")
        t.update(excluded=[s for s in seeds if s not in keep], group=f"chain_sum, {u} updates")
        tests[f"chain_sum, {u} update{'s' * (u != 1)}: {GMPO} vs {AGAINST}"] = t
    for (name, t), adj in zip(tests.items(), holm([t["p"] for t in tests.values()]), strict=True):
        t.update(name=name, holm=adj)
        t["verdict"] = tiny_verdict(t)
    return tests


def analyze(results: Any) -> tuple[dict[str, Any], list[str]]:
    rates = json.loads((results / "rates.json").read_text())
    grid = records(results, "grid")
    out: dict[str, Any] = {"rates": rates["rates"]}
    lines = ["# The off-policy study's planned analysis", ""]
    if grid:
        p = primary(grid, rates)
        out.update(primary=p, mechanism=mechanism(grid, p["counted"]),
                   secondary=secondary(grid, p["counted"]))  # fmt: skip
        lines += [f"## Primary: {p['verdict']}", "",
                  f"Seeds that count: {len(p['counted'])} ({', '.join(map(str, p['counted']))}); "
                  f"excluded (the clip never acted in a run): {p['excluded'] or 'none'}. MDE at "
                  f"{len(p['counted'])} seeds: {p['mde']:.4f} (paired SD {rates['paired_sd']:.4f});"
                  f" the *same* margin ±{p['margin']:.4f}.", "",
                  *_test_rows({"p": p}, "higher"), "",
                  "| loss | rate | runs | clipped fraction mean [min, max] | spread | entropy | "
                  "length | training AUC | held-out after |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for loss, m in out["mechanism"].items():
            lines.append(f"| {loss} | {rates['rates'][loss]:g} | {m['runs']} | "
                         f"{m['clipped_mean']:.4f} [{m['clipped_min']:.4f}, {m['clipped_max']:.4f}]"
                         f" | {m['spread_mean']:.3f} | {m['entropy_mean']:.3f} | "
                         f"{m['length_mean']:.2f} | {m['reward_auc']:.3f} | {m[ENDPOINT]:.3f} |")  # fmt: skip
        lines += ["", "## Secondary (Holm over these rows)", "",
                  *_test_rows(out["secondary"], "better")]  # fmt: skip
    arm = records(results, "arm")
    if arm:
        seeds = sorted({r["seed"] for r in arm if r["loss"] == GMPO}
                       & {r["seed"] for r in arm if r["loss"] == AGAINST})  # fmt: skip
        t = compare(as_cells(arm, seeds), AGAINST, ENDPOINT)
        t.update(name=f"1 update: {GMPO} vs {AGAINST}", holm=t["p"],
                 clip_acted=sum(clip_acted(r) for r in arm))  # fmt: skip
        out["arm"] = t
        lines += ["", f"## The 1-update arm ({len(seeds)} seeds; descriptive)", "",
                  *_test_rows({"a": t}, "higher")]  # fmt: skip
    if (results / "tiny" / "pilot.json").exists():
        out["tiny"] = tiny(results)
        rows = _test_rows(out["tiny"], "higher")
        lines += ["", "## chain_sum (the tiny model; Holm over its regimes)", "",
                  rows[0] + " excluded | verdict |", rows[1] + "---|---|",
                  *(f"{row} {t['excluded'] or '—'} | {t['verdict']} |"
                    for row, t in zip(rows[2:], out["tiny"].values(), strict=True))]  # fmt: skip
    return out, lines


def analysis(args: argparse.Namespace) -> int:
    out, lines = analyze(args.results)
    (args.results / "offpolicy.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.results / "offpolicy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0
