"""The second study's pilot rule and planned analysis (docs/which_loss_plan.md) on made-up
records, each answer worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.stability import pilot, which_loss
from studies.stability.sweep import write_curves


def _run(variant: str, lr: float, seed: int, final: float, start: float = 0.2, **kw: float) -> dict:
    base = {"task": "t", "variant": variant, "lr": lr, "grad_clip": None, "seed": seed,
            "final_reward": final, "start_reward": start, "failed": final < start,
            "spread_all": 1.0, "spread_first20": 1.0, "entropy_all": 0.5,
            "entropy_first20": 0.6, "length_all": 3.0}  # fmt: skip
    return {**base, **kw}


def test_the_pilot_picks_the_largest_rate_at_which_every_variant_learns() -> None:
    # gains over the 0.2 start, per seed: at 1e-3 both learn (median 0.2, 0.15); at 2e-3 'b'
    # does not (median 0.05); at 4e-3 'a' learns alone: the rate is 1e-3, its stress 2e-3 is
    # kept (a learns there)
    gains = {("a", 1e-3): (0.2, 0.3, 0.1), ("b", 1e-3): (0.15, 0.1, 0.2),
             ("a", 2e-3): (0.3, 0.2, 0.4), ("b", 2e-3): (0.05, 0.0, 0.3),
             ("a", 4e-3): (0.2, 0.1, 0.1), ("b", 4e-3): (-0.2, -0.1, 0.0)}  # fmt: skip
    records = [_run(v, lr, s, 0.2 + g) for (v, lr), gs in gains.items() for s, g in enumerate(gs)]
    out = pilot.pick(records)
    assert (out["rate"], out["stress"], out["every"]) == (1e-3, 2e-3, True)
    assert out["learners"][4e-3] == ["a"]


def test_no_stress_cell_where_no_variant_learns_and_the_fallback() -> None:
    gains = {("a", 1e-3): 0.2, ("b", 1e-3): 0.0, ("a", 2e-3): 0.0, ("b", 2e-3): 0.0}
    records = [_run(v, lr, s, 0.2 + g) for (v, lr), g in gains.items() for s in range(3)]
    out = pilot.pick(records)
    # no rate has both learning: the rate where the most learn (1 at 1e-3); at 2e-3 none learns
    assert (out["rate"], out["stress"], out["every"]) == (1e-3, None, False)
    none = [_run(v, 1e-3, s, 0.2) for v in "ab" for s in range(3)]
    assert pilot.pick(none)["rate"] is None  # dropped


def test_the_seed_is_the_unit_and_the_test_is_two_sided() -> None:
    # 8 seeds, two cells each; GMPO's seed mean is higher on 7 and lower on 1
    records = []
    for s in range(8):
        g = (0.6, 0.4) if s < 7 else (0.1, 0.1)
        records += [_run("gmpo", 1e-3, s, g[0]), _run("gmpo", 2e-3, s, g[1]),
                    _run("dapo", 1e-3, s, 0.3), _run("dapo", 2e-3, s, 0.3)]  # fmt: skip
    t = which_loss.compare(records, "dapo", "final_reward")
    assert (t["seeds"], t["wins"], t["losses"], t["ties"]) == (8, 7, 1, 0)
    # two-sided: 2 * P(X >= 7), X ~ Bin(8, 1/2) = 2 * 9/256
    assert t["p"] == pytest.approx(18 / 256)
    # differences: 0.2 on seven seeds, -0.2 on one: mean 0.15, median 0.2
    assert t["mean_diff"] == pytest.approx(0.15) and t["median_diff"] == pytest.approx(0.2)
    assert t["ci"][0] <= 0.15 <= t["ci"][1]
    fails = which_loss.compare(records, "dapo", "failed", -1)
    assert (fails["wins"], fails["losses"]) == (0, 1)  # seed 7: GMPO below its start twice


def test_the_report_from_sweep_directories(tmp_path: Path) -> None:
    for task, length in (("reverse", 17.0), ("chain_sum", None)):
        d = tmp_path / task
        d.mkdir()
        records, curves = [], []
        for s in range(4):
            for v, f in (("gmpo", 0.5), ("grpo", 0.4), ("dapo", 0.6)):
                ln = length if length is not None else 2.0 + s + (v == "gmpo")
                records.append({**_run(v, 1e-3, s, f + 0.01 * s), "task": task, "length_all": ln})
                curves.append({"variant": v, "lr": 1e-3, "grad_clip": None, "seed": s,
                               "curves": {"length": [ln] * 100}})  # fmt: skip
        (d / "summary.json").write_text(json.dumps(records))
        write_curves(d, curves)
    out, lines = which_loss.analyze([tmp_path / "reverse", tmp_path / "chain_sum"])
    text = "\n".join(lines)
    primary = out["primary"]
    assert list(primary) == ["reverse: gmpo vs grpo", "reverse: gmpo vs dapo",
                             "chain_sum: gmpo vs grpo", "chain_sum: gmpo vs dapo"]  # fmt: skip
    assert (
        primary["reverse: gmpo vs grpo"]["wins"],
        primary["reverse: gmpo vs dapo"]["losses"],
    ) == (4, 4)
    # Holm over the four: p = 2/16 each, the smallest times 4
    assert primary["reverse: gmpo vs grpo"]["holm"] == pytest.approx(min(1.0, 4 * 0.125))
    assert "### Completion length over training" in text.split("## chain_sum")[1]
    assert "### Completion length over training" not in text.split("## chain_sum")[0]
