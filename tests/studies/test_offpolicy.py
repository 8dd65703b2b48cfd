"""The off-policy study's rules (studies/offpolicy/design.py, budget.py, analyze.py), each on
made-up records whose answer is worked out by hand: the rate rule, the paired SD and the
minimum detectable difference of the sign test, the verdict, the exclusion of runs where the
clip never acted, the cumulative budget rule, the analysis; and the seeds' freshness."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from studies.offpolicy import budget
from studies.offpolicy import design as d
from studies.offpolicy.analyze import analyze
from studies.offpolicy.real import outcome

ROOT = Path(__file__).resolve().parents[2]


def _rec(loss: str, lr: float, seed: int, after: float, clip: float = 0.01, **kw: Any) -> dict:
    return {"loss": loss, "lr": lr, "seed": seed, d.ENDPOINT: after, d.CLIP_KEY: clip,
            "clipped_fraction_mean": clip / 2, "spread_mean": 1.0, "entropy_mean": 0.5,
            "length_mean": 8.0, "reward_auc": 0.3, "wall_s": 500.0, **kw}  # fmt: skip


def test_the_rate_rule_takes_the_best_mean_where_the_clip_acted() -> None:
    a, b, c = d.LADDER
    rs = [
        # gmpo: means 0.30 (a), 0.50 (b), 0.50 (c): a tie, the lower rate wins
        _rec("gmpo", a, 8000, 0.2), _rec("gmpo", a, 8001, 0.4),
        _rec("gmpo", b, 8000, 0.6), _rec("gmpo", b, 8001, 0.4),
        _rec("gmpo", c, 8000, 0.5), _rec("gmpo", c, 8001, 0.5),
        # dapo_trl: the best mean (0.9 at c) had a run where the clip never acted: not eligible;
        # of the rest, a (0.35) beats b (0.25), and a is the lowest rate it ran: the edge
        _rec("dapo_trl", a, 8000, 0.3), _rec("dapo_trl", a, 8001, 0.4),
        _rec("dapo_trl", b, 8000, 0.2), _rec("dapo_trl", b, 8001, 0.3),
        _rec("dapo_trl", c, 8000, 0.9), _rec("dapo_trl", c, 8001, 0.9, clip=0.0),
    ]  # fmt: skip
    out = d.pick(rs)
    assert out["rates"] == {"gmpo": b, "dapo_trl": a}
    assert out["edge"] == {"dapo_trl": "low"}
    assert out["means"]["gmpo"][repr(a)]["mean"] == pytest.approx(0.3)
    assert not out["means"]["dapo_trl"][repr(c)]["clip_acted"]
    assert d.extension(rs) == [("dapo_trl", a / 2)]
    # once extended to a / 2 (a pick there is at the edge again), no further: EXTEND is 1
    more = rs + [_rec("dapo_trl", a / 2, s, 0.8) for s in d.PILOT_SEEDS]
    assert d.pick(more)["rates"]["dapo_trl"] == a / 2 and d.extension(more) == []
    # a loss with no rate at which the clip acted gets none, and the grid is stopped
    never = [{**r, d.CLIP_KEY: 0.0} if r["loss"] == "gmpo" else r for r in rs]
    assert "gmpo" not in d.pick(never)["rates"]
    assert outcome(never)["stop"] == "the clip never acted at any pilot rate of gmpo"


def test_the_paired_sd_pools_the_differences_within_rates() -> None:
    a, b, _ = d.LADDER
    rs = [_rec("gmpo", a, 8000, 0.5), _rec("dapo_trl", a, 8000, 0.4),  # d = +0.1
          _rec("gmpo", a, 8001, 0.5), _rec("dapo_trl", a, 8001, 0.2),  # d = +0.3
          _rec("gmpo", b, 8000, 0.5), _rec("dapo_trl", b, 8000, 0.5),  # d = 0.0
          _rec("gmpo", b, 8001, 0.6), _rec("dapo_trl", b, 8001, 0.4)]  # d = +0.2  # fmt: skip
    # within a: mean 0.2, squares 0.01 + 0.01; within b: mean 0.1, 0.01 + 0.01; 2 df
    sd, df = d.paired_sd(rs)
    assert df == 2 and sd == pytest.approx(math.sqrt(0.04 / 2))
    # a pair whose clip never acted leaves its rate with one seed: that rate drops out
    rs[0][d.CLIP_KEY] = 0.0
    assert d.paired_sd(rs) == (pytest.approx(math.sqrt(0.02)), 1)


def test_the_mde_is_the_sign_tests_at_its_threshold() -> None:
    # 12 seeds: 10 wins give two-sided p = 2 (1 + 12 + 66) / 4096 = 0.0386 < 0.05; 9 give
    # 2 * 299 / 4096 = 0.146
    assert d.sign_threshold(12) == 10 and d.sign_threshold(5) is None
    p = d.win_probability(12)
    assert d.binomial_tail(12, 10, p) == pytest.approx(0.8, abs=1e-9)
    assert d.binomial_tail(12, 10, p - 1e-3) < 0.8
    assert p == pytest.approx(0.8693, abs=1e-4)
    # MDE = z(p*) sd: z(0.8693) = 1.123
    assert d.mde(0.1, 12) == pytest.approx(0.1123, abs=1e-4)
    assert d.mde(0.1, 16) < d.mde(0.1, 12) < d.mde(0.1, 14)  # 12 of 14 needed at 14 seeds
    assert math.isnan(d.mde(0.1, 5))


def _t(mean: float, lo: float, hi: float, wins: int, losses: int, p: float) -> dict[str, Any]:
    return {"mean_diff": mean, "ci": [lo, hi], "wins": wins, "losses": losses, "p": p}


def test_the_verdict_reads_the_row_with_the_mde() -> None:
    assert d.verdict(_t(0.08, 0.04, 0.12, 11, 1, 0.006), 0.06) == "helps"
    # significant, but below MIN_EFFECT: neither helps nor same (same needs p >= 0.05)
    assert d.verdict(_t(0.01, 0.004, 0.02, 11, 1, 0.006), 0.06) == "inconclusive"
    assert d.verdict(_t(-0.08, -0.12, -0.04, 1, 11, 0.006), 0.06) == "hurts"
    # same: the interval within +- max(0.05, MDE)
    assert d.verdict(_t(0.0, -0.04, 0.04, 6, 6, 1.0), 0.03) == "same"
    assert d.verdict(_t(0.0, -0.07, 0.07, 6, 6, 1.0), 0.03) == "inconclusive"
    assert d.verdict(_t(0.0, -0.07, 0.07, 6, 6, 1.0), 0.08) == "same"
    # an MDE above 0.10: never same
    assert d.verdict(_t(0.0, -0.02, 0.02, 6, 6, 1.0), 0.11) == "inconclusive"


def test_a_seed_counts_only_where_the_clip_acted_in_both_runs() -> None:
    rs = [_rec("gmpo", 1e-5, 1, 0.5), _rec("dapo_trl", 2e-5, 1, 0.4),
          _rec("gmpo", 1e-5, 2, 0.5, clip=0.0), _rec("dapo_trl", 2e-5, 2, 0.4),
          _rec("gmpo", 1e-5, 3, 0.5)]  # seed 3: not finished  # fmt: skip
    assert d.counted(rs, (1, 2, 3)) == ([1], [2])


def test_the_budget_rule_is_cumulative_in_the_plans_order() -> None:
    h = 3600.0
    parts = [
        {"part": n, "runs": 1, "wall_s": w * h}
        for n, w in zip(budget.PARTS, (2, 4, 0.5, 2), strict=True)
    ]
    parts[3]["per_seed_s"] = 0.25 * h
    # 0.5 h spent: pilot and grid never dropped (6.5 h), chain_sum fits (7.0 h), 4 arm seeds
    assert budget.decide(0.5 * h, parts) == ["never dropped (the plan)"] * 2 + [
        "fits", "4 of 12 seeds fit"]  # fmt: skip
    # 2 h spent: 8 h after the grid; chain_sum does not fit, and the arm goes with it
    assert budget.decide(2 * h, parts)[2:] == [
        "does not fit: dropped, with every later part",
        "dropped, as an earlier part was",
    ]
    assert budget.fits(7.5 * h, 0.5 * h) and not budget.fits(7.5 * h, 0.51 * h)
    table = budget.table(parts, 0.5 * h)
    assert table[2] == "| the real model's pilot | 1 | 2.00 | 2.50 | never dropped (the plan) |"


def test_the_estimates_come_from_the_measured_numbers() -> None:
    m = budget.measured(ROOT / "results")
    # the cross-check's longest seed 872 s over two runs; calibration 167.3 s over 3 seeds
    assert m["compare_1u"] == 436 and m["eval"] == pytest.approx(55.78, abs=0.01)
    assert m["run_1u"] < m["run_4u"] < m["train_2u"]
    parts = budget.estimate(m)
    assert [p["runs"] for p in parts[:2]] == [16, 24] and parts[3]["runs"] == 24
    # after the pilot, its mean run time replaces the 4-update estimate
    after = budget.estimate(m, [600.0, 800.0])
    assert after[1]["wall_s"] == 24 * 700.0
    assert after[3]["per_seed_s"] == pytest.approx(2 * 700.0 * m["run_1u"] / m["run_4u"])


def _write_results(root: Path) -> None:
    """rates.json; a grid of 12 seeds + a spare where GMPO is 0.1 higher on 11 and 0.05 lower on
    one, seed 8105 excluded (the clip never acted in its GMPO run); the tiny part's records."""
    rates = {"rates": {"gmpo": 2e-5, "dapo_trl": 1e-5}, "paired_sd": 0.05}
    root.mkdir(parents=True)
    (root / "rates.json").write_text(json.dumps(rates))
    for i, s in enumerate((*d.GRID_SEEDS, d.SPARE_SEEDS[0])):
        diff = -0.05 if i == 0 else 0.1
        clip = 0.0 if s == 8105 else 0.02
        for r in (_rec("gmpo", 2e-5, s, 0.4 + diff, clip=clip), _rec("dapo_trl", 1e-5, s, 0.4)):
            path = root / "real" / "grid" / f"{r['loss']}_seed{s}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(r))
    (root / "tiny").mkdir()
    (root / "tiny" / "pilot.json").write_text(json.dumps({"regimes": {
        f"u{u}": {"rates": {"gmpo": 1e-3, "dapo_trl": 2e-3}} for u in d.TINY_REGIMES}}))  # fmt: skip
    for u in d.TINY_REGIMES:
        recs = [{"variant": v, "lr": lr, "seed": s, "grad_clip": None,
                 "final_reward": 0.5 + (0.1 if v == "gmpo" else 0.0),
                 "clipped_fraction_mean": 0.0 if (u > 1 and s == 8300) or u == 1 else 0.01}
                for s in d.TINY_GRID_SEEDS for v, lr in (("gmpo", 1e-3), ("dapo_trl", 2e-3))]  # fmt: skip
        recs.append({**recs[0], "lr": 4e-3, "final_reward": 0.0})  # another rate: not primary
        where = root / "tiny" / "grid" / f"u{u}"
        where.mkdir(parents=True)
        (where / "summary.json.gz").write_bytes(gzip.compress(json.dumps(recs).encode()))


def test_the_analysis_on_made_up_records(tmp_path: Path) -> None:
    _write_results(tmp_path / "r")
    out, lines = analyze(tmp_path / "r")
    p = out["primary"]
    # 8105 excluded, the spare 8112 counts in its place: 12 seeds, 11 wins (+0.1), 1 loss
    assert p["excluded"] == [8105] and len(p["counted"]) == 12 and 8112 in p["counted"]
    assert (p["wins"], p["losses"], p["seeds"]) == (11, 1, 12)
    assert p["mean_diff"] == pytest.approx((11 * 0.1 - 0.05) / 12)
    assert p["p"] == pytest.approx(2 * 13 / 4096)
    assert p["mde"] == pytest.approx(d.mde(0.05, 12)) and p["verdict"] == "helps"
    assert out["mechanism"]["gmpo"]["clipped_mean"] == pytest.approx(0.01)
    assert "## Primary: helps" in lines
    # chain_sum: 16 seeds at 1 update (no exclusion, on-policy); 15 at 2, 4 and 16 updates
    rows = out["tiny"]
    assert [t["seeds"] for t in rows.values()] == [16, 15, 15, 15]
    assert [t["excluded"] for t in rows.values()] == [[], [8300], [8300], [8300]]
    assert all(t["verdict"] == "helps" and t["wins"] == t["seeds"] for t in rows.values())


def _seeds(x: Any, out: set[int]) -> set[int]:
    if isinstance(x, dict):
        for k, v in x.items():
            if k in ("seed", "seeds"):
                out.update(s for s in (v if isinstance(v, list) else [v]) if isinstance(s, int))
            _seeds(v, out)
    elif isinstance(x, list):
        for v in x:
            _seeds(v, out)
    return out


def test_the_plans_seeds_are_fresh_and_apart() -> None:
    used: set[int] = set()
    for path in (ROOT / "results").rglob("*.json*"):
        if "offpolicy" not in path.parts and path.suffix in (".json", ".gz"):
            text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text()
            _seeds(json.loads(text), used)
    assert {0, 1000, 4000, 5900, 6000, 6100} <= used  # the scan finds the earlier studies' seeds
    blocks = [set(x) for x in (d.PILOT_SEEDS, d.GRID_SEEDS, d.SPARE_SEEDS, d.TINY_PILOT_SEEDS,
                               d.TINY_GRID_SEEDS)]  # fmt: skip
    assert not used & set.union(*blocks)
    assert sum(map(len, blocks)) == len(set.union(*blocks))
    assert len(d.GRID_SEEDS) >= 12 and len(d.TINY_GRID_SEEDS) == 16


def test_the_make_targets_run_the_plans_steps() -> None:
    text = (ROOT / "Makefile").read_text()
    assert "\nOFFPOLICY = $(BIN)/python -m studies.offpolicy\n" in text
    for target, step in (("study-offpolicy-pilot", "pilot"), ("study-offpolicy-rates", "rates"),
                         ("study-offpolicy", "grid"), ("study-offpolicy-analysis", "analysis"),
                         ("study-offpolicy-chain-sum-pilot", "tiny-pilot"),
                         ("study-offpolicy-chain-sum", "tiny-grid"),
                         ("study-offpolicy-arm", "arm"), ("study-offpolicy-budget", "budget")):  # fmt: skip
        recipe = text.split(f"\n{target}: setup\n", 1)[1].split("\n\n", 1)[0]
        assert f"\t$(OFFPOLICY) {step}\n" in recipe + "\n", target
