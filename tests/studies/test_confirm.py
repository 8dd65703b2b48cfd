"""The confirmatory study's pieces (docs/study_plan.md): the failure rule, Holm, the mechanism
metrics of an update, the setup the options build, methods by module:function, and the
analysis on made-up records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gmpo_stats.outcome import collapse, failed
from gmpo_stats.paired import holm
from gmpo_tasks import add
from gmpo_variants import VARIANTS, resolve
from gmpo_variants.grpo import grpo_arithmetic_loss
from studies.stability import __main__ as stability
from studies.stability import confirm
from studies.stability.fingerprint import fingerprint
from studies.stability.run import CURVES, Setup, rl_run, update_stats, warm_start
from studies.stability.sweep import write_curves


def test_failure_sees_the_fall_from_the_warm_start() -> None:
    straight_down = [0.05] * 100  # from a warm start of 0.22 straight to ~0: no peak to fall from
    assert not collapse(straight_down).collapsed and failed(straight_down, 0.22)
    learned_and_lost = [0.2] * 20 + [0.9] * 30 + [0.5] * 50
    assert failed(learned_and_lost, 0.2) and collapse(learned_and_lost).collapsed
    assert not failed([0.2] * 20 + [0.5] * 80, 0.22)  # learned and kept it
    assert failed([0.21] * 100, 0.22)  # below the start by a little


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_update_stats_against_numpy() -> None:
    g = torch.Generator().manual_seed(0)
    r = torch.randn(16, 9, generator=g, dtype=torch.float64) * 0.3
    adv = torch.tensor([1.0, -1.0] * 8, dtype=torch.float64)
    mask = torch.ones(16, 9, dtype=torch.bool)
    mask[3, 5:] = False
    out = update_stats(r, adv, mask, (0.2, 0.3))
    valid = r.numpy()[mask.numpy()]
    for key, q in zip(("q01", "q05", "q95", "q99"), (0.01, 0.05, 0.95, 0.99), strict=True):
        assert out[key] == pytest.approx(np.quantile(valid, q), rel=1e-12)
    rows = np.array([r.numpy()[i][mask.numpy()[i]].mean() for i in range(16)])
    assert out["seq_range"] == pytest.approx(rows.max() - rows.min(), rel=1e-12)
    a = np.broadcast_to(adv.numpy()[:, None], r.shape)[mask.numpy()]
    assert out["clip_low"] == pytest.approx(np.mean((valid < -0.2) & (a < 0)))
    assert out["clip_high"] == pytest.approx(np.mean((valid > 0.3) & (a > 0)))
    assert out["clip_low"] > 0 and out["clip_high"] > 0
    assert math.isnan(update_stats(r, adv, mask, None)["clip_low"])


def test_the_confirmatory_methods_have_their_clip_bounds() -> None:
    assert VARIANTS["grpo"].bounds == pytest.approx((-math.log(0.8), math.log(1.2)))
    assert VARIANTS["grpo_wide"].bounds == VARIANTS["gmpo"].bounds == (0.4, 0.4)
    assert VARIANTS["gmpo_narrow"].bounds == (0.2, 0.2)


def test_token_mean_per_row_equals_the_minibatch_token_mean_at_equal_lengths() -> None:
    """The other setup's GRPO averages over all tokens of a minibatch ("dapo"); this study's
    over each row's tokens, then rows. Every completion here has the same length, so the two
    are the same loss: the aggregation cannot be what moves the regime."""
    g = torch.Generator().manual_seed(1)
    logp, old = torch.randn(16, 9, generator=g) * 0.1 - 2, torch.randn(16, 9, generator=g) * 0.1 - 2
    adv, mask = torch.randn(16, generator=g), torch.ones(16, 9)
    ours = grpo_arithmetic_loss(logp, old, adv, mask, 0.2, 0.2)
    ratio = (logp - old).exp()
    per_token = -torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    assert torch.allclose(ours, per_token.sum() / mask.sum(), rtol=1e-6, atol=0)


TINY = {"warm_steps": 20, "warm_batch": 16, "prompts": 2, "group": 4, "minibatches": 2, "steps": 3}


@pytest.mark.parametrize("task", ["reverse", "add"])
def test_runs_log_every_curve(task: str) -> None:
    torch.set_num_threads(1)
    setup = Setup(task_name=task, length=3, **TINY)
    warm = warm_start(setup, 0)
    run = rl_run(setup, warm, "gmpo", 5e-3, 1.0, 0)
    assert set(run) == set(CURVES) and all(len(v) == 3 for v in run.values())
    for step in range(3):
        q = [run[k][step] for k in ("q01", "q05", "q95", "q99")]
        assert (
            q == sorted(q)
            and run["log_ratio_min"][step] <= q[0] <= q[-1] <= run["log_ratio_max"][step]
        )
        assert 0 <= run["clip_low"][step] + run["clip_high"][step] <= 1


def test_setup_options_change_the_run() -> None:
    base = Setup(length=3, **TINY)
    untied = Setup(length=3, tied=False, **TINY)
    assert base.model().head is None and untied.model().head is not None
    warm = warm_start(base, 0)
    a = rl_run(base, warm, "gmpo", 5e-3, None, 0)
    b = rl_run(Setup(length=3, beta2=0.99, **TINY), warm, "gmpo", 5e-3, None, 0)
    assert a != b


def test_setup_overrides_and_the_task_settings() -> None:
    args = stability.parse(["--task", "add", "--setup", "beta2=0.99,tied=false,warm_lr=1e-3"])
    setup = args.setup
    assert (setup.task_name, setup.beta2, setup.tied, setup.warm_lr) == ("add", 0.99, False, 1e-3)
    assert (setup.length, setup.noise, setup.warm_steps) == (add.LENGTH, add.NOISE, add.WARM.steps)
    assert setup.task.answer_length == add.LENGTH + 1
    assert stability.parse(["--quick", "--task", "add"]).setup.length == 3


def test_a_variant_by_module_and_function() -> None:
    """A registered function named as module:function is its variant (bounds included)."""
    assert resolve("gmpo_variants.gmpo:gmpo_variant") is VARIANTS["gmpo"]
    assert fingerprint("gmpo_variants.gmpo:gmpo_variant") == fingerprint("gmpo")
    other = resolve("gmpo_variants.gmpo:gmpo_from_blocks")
    assert other.bounds is None and fingerprint(other.name) != fingerprint("gmpo")
    with pytest.raises(ValueError, match="no_such"):
        resolve("no_such_module_q:f")


def _records() -> list[dict]:
    """Two tasks, one cell, 12 seeds: gmpo beats grpo on 10 of 12 seeds, ties grpo_wide."""
    out = []
    for task in ("reverse", "add"):
        for seed in range(12):
            finals = {"grpo": 0.5, "grpo_wide": 0.6, "gmpo": 0.6 if seed < 10 else 0.4,
                      "gmpo_narrow": 0.5}  # fmt: skip
            for m, f in finals.items():
                out.append({"task": task, "variant": m, "lr": 2e-3, "grad_clip": None, "seed": seed,
                            "final_reward": f, "peak_reward": 0.7, "start_reward": 0.2,
                            "failed": f < 0.45, "collapsed": False,
                            "spread_first20": 1.0 if m.startswith("gmpo") else 2.0,
                            "entropy_first20": 0.5})  # fmt: skip
    return out


def test_the_analysis_on_made_up_records() -> None:
    out = confirm.analyse(_records())
    c1 = [r for r in out["primary"] if r["comparison"] == "C1"]
    assert [(r["wins"], r["losses"], r["ties"]) for r in c1] == [(10, 2, 0)] * 2
    p = sum(math.comb(12, k) for k in range(10, 13)) / 2**12  # 0.0193
    assert c1[0]["p"] == pytest.approx(p)
    assert c1[0]["p_holm"] == pytest.approx(min(1.0, 6 * p)) and not c1[0]["confirmed"]
    c2 = [r for r in out["primary"] if r["comparison"] == "C2"]
    assert [(r["wins"], r["losses"], r["ties"]) for r in c2] == [(0, 2, 10)] * 2
    spread = [r for r in out["mechanism"] if r["metric"] == "spread" and r["comparison"] == "C1"]
    assert [(r["wins"], r["losses"]) for r in spread] == [(12, 0)] * 2 and all(
        r["confirmed"] for r in spread
    )
    entropy = [r for r in out["mechanism"] if r["metric"] == "entropy"]
    assert all(r["ties"] == 12 and r["p"] == 1.0 for r in entropy)
    fails = [r for r in out["failures"] if r["comparison"] == "C1"]
    assert [(r["better"], r["worse"]) for r in fails] == [(0, 2)] * 2
    assert "against GMPO: C1 is confirmed on neither task" in out["verdicts"]
    assert any("entropy" in v for v in out["verdicts"])
    assert "gmpo failed in more runs than grpo on every task" in " ".join(out["verdicts"])


def test_the_regime_table_counts_learned_and_failed() -> None:
    from studies.stability import regime

    records = [{"variant": "gmpo", "start_reward": 0.2, "final_reward": f, "peak_reward": p,
                "failed": fail} for f, p, fail in ((0.8, 0.9, False), (0.0, 0.6, True), (0.1, 0.3, True))]  # fmt: skip
    (row,) = regime.rows("base", records)
    assert row.startswith("| base | gmpo | 3 |") and row.endswith("| 2/3 | 2/3 |"), row


def _run(task: str, method: str, clip: float | None, seed: int, final: float, **kw) -> dict:  # type: ignore[no-untyped-def]
    return {"task": task, "variant": method, "lr": 2e-3, "grad_clip": clip, "seed": seed,
            "final_reward": final, "failed": kw.get("failed", final < 0.2),
            "start_reward": kw.get("start", 0.2), "spread_all": kw.get("spread", 1.0),
            "entropy_all": kw.get("entropy", 0.5)}  # fmt: skip


def test_seed_pairs_average_a_seeds_cells() -> None:
    from gmpo_stats.paired import seed_pairs

    records = [
        _run("t", "a", None, 0, 0.9),
        _run("t", "b", None, 0, 0.1),  # +0.8
        _run("t", "a", 1.0, 0, 0.2),
        _run("t", "b", 1.0, 0, 0.3),  # -0.1: seed 0 a win
        _run("t", "a", None, 1, 0.5),
        _run("t", "b", None, 1, 0.75),
        _run("t", "a", 1.0, 1, 0.5),
        _run("t", "b", 1.0, 1, 0.25),  # means 0.5, 0.5: a tie
        _run("t", "a", None, 2, 0.5),
        _run("t", "b", None, 2, 0.25),
        _run("t", "a", 1.0, 2, 0.0),
    ]  # seed 2: b has no clipped run, one cell counts
    by_seed = seed_pairs(records, "a", "b", "final_reward")
    assert [x for pair in by_seed for x in pair] == pytest.approx([0.55, 0.2, 0.5, 0.5, 0.5, 0.25])
    assert confirm.sign(by_seed) == {"wins": 2, "losses": 0, "ties": 1, "p": 0.25, "p_reverse": 1.0}
    # a boolean key: the share of the seed's runs (of the cells both ran) that failed
    assert seed_pairs(records, "a", "b", "failed") == [(0.0, 0.5), (0.0, 0.0), (0.0, 0.0)]


def _by_seed_records() -> list[dict]:
    """16 seeds on which gmpo wins one cell by much and loses the other by little; 4 seeds on
    which it loses both: 16 wins and 24 losses by run, 16 wins and 4 losses by seed."""
    out = []
    for seed in range(20):
        first = seed < 16
        for clip, (g, r) in ((None, (0.8, 0.2) if first else (0.3, 0.4)),
                             (1.0, (0.5, 0.6) if first else (0.3, 0.4))):  # fmt: skip
            start = 0.01 if seed == 0 else 0.04 if seed == 1 else 0.3
            out += [_run("reverse", "gmpo", clip, seed, g, start=start, spread=1.0,
                         failed=clip is None and not first),
                    _run("reverse", "grpo", clip, seed, r, start=start, spread=2.0,
                         failed=not first)]  # fmt: skip
    return out


def test_the_seed_as_the_unit_by_hand() -> None:
    from studies.stability import unplanned

    records = _by_seed_records()
    pooled = confirm.sign(confirm.pairs(records, "gmpo", "grpo", "final_reward"))
    assert (pooled["wins"], pooled["losses"]) == (16, 24)
    out = unplanned.analyse(records, (("C1", "gmpo", "grpo"),), (("spread", -1),), ("C1",))
    (seed,) = out["by_seed"]
    assert (seed["seeds"], seed["wins"], seed["losses"], seed["ties"]) == (20, 16, 4, 0)
    assert seed["p"] == pytest.approx(sum(math.comb(20, k) for k in range(16, 21)) / 2**20)
    assert seed["p"] == pytest.approx(0.0059, abs=5e-5) and seed["p_holm"] == seed["p"]
    # failures by seed: gmpo failed 1 of 2 runs on the last 4 seeds, grpo 2 of 2: 4 fewer
    (fails,) = out["by_seed_failures"]
    assert (fails["wins"], fails["losses"], fails["ties"]) == (4, 0, 16)
    # each cell alone: unclipped gmpo wins 16 and loses 4; clipped it loses all 20
    cells = {r["grad_clip"]: r for r in out["by_cell"]}
    assert [r["grad_clip"] for r in out["by_cell"]] == [None, 1.0]
    assert (cells[None]["wins"], cells[None]["losses"], cells[None]["ties"]) == (16, 4, 0)
    assert (cells[1.0]["wins"], cells[1.0]["losses"]) == (0, 20) and cells[1.0]["p"] == 1.0
    assert (cells[None]["failures_better"], cells[None]["failures_worse"]) == (0, 0)
    assert (cells[1.0]["failures_better"], cells[1.0]["failures_worse"]) == (4, 0)
    assert cells[1.0]["failures_p"] == pytest.approx(1 / 16)
    (spread,) = out["mechanism_all"]
    assert (spread["wins"], spread["losses"], spread["p"]) == (40, 0, pytest.approx(2.0**-40))
    (warm,) = out["warm_starts"]
    assert (warm["seeds"], warm["below"], warm["failed"], warm["runs"]) == (20, 2, 12, 80)
    assert warm["min"] == 0.01 and warm["median"] == 0.3 and warm["max"] == 0.3
    assert warm["no_right_completion"] == pytest.approx((0.99**8 + 0.96**8) / 2)


def test_scope_counts_the_models_parameters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from studies.stability import unplanned

    setup = {**Setup(length=3, d=8, heads=2, layers=1).__dict__}
    (tmp_path / "summary.md").write_text(f"# x\n\nSetup: `{json.dumps(setup)}`; more\n")
    assert unplanned.setups([tmp_path]) == {"reverse": setup}
    scope = unplanned.scope(setup)
    # 16 tokens and 7 positions (a prompt of 3 digits and "=", an answer of 3) of width 8; one
    # block: two LayerNorms, qkv, the projection, the 4x MLP; the final LayerNorm; tied output
    d, block = 8, 2 * 2 * 8 + (8 * 24 + 24) + (8 * 8 + 8) + (8 * 32 + 32) + (32 * 8 + 8)
    assert scope["parameters"] == 16 * d + 7 * d + block + 2 * d
    assert (scope["prompt_tokens"], scope["answer_tokens"], scope["updates"]) == (4, 3, 16)


def test_confirm_md_keeps_the_plans_tables_and_adds_the_rest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    records = [{**r, "task": t, "peak_reward": 0.9, "collapsed": False,
                **{f"{k}_{span}": 0.1 for k in ("q01", "q05", "q95", "q99", "spread", "seq_range",
                                                "clip_low", "clip_high", "entropy")
                   for span in ("first20", "all")}}
               for t in ("reverse", "add") for r in _by_seed_records()]  # fmt: skip
    records += [{**r, "variant": m} for r in records for m in ("grpo_wide", "gmpo_narrow")
                if r["variant"] == "grpo"]  # fmt: skip
    for task in ("reverse", "add"):
        (tmp_path / task).mkdir()
        (tmp_path / task / "summary.json").write_text(
            json.dumps([r for r in records if r["task"] == task])
        )
        (tmp_path / task / "summary.md").write_text(
            f"Setup: `{json.dumps(Setup(task_name=task, length=3).__dict__)}`\n"
        )
    argv = [str(tmp_path / "reverse"), str(tmp_path / "add"), "--out", str(tmp_path / "out")]
    assert confirm.main(argv) == 0
    text = (tmp_path / "out" / "confirm.md").read_text()
    planned = confirm.report(confirm.analyse(records), records,
                             " ".join(["python -m studies.stability.confirm", *argv]))  # fmt: skip
    assert text.startswith(planned) and text[len(planned) :].startswith("\n## Beside the plan\n")
    saved = json.loads((tmp_path / "out" / "confirm.json").read_text())
    assert saved["unplanned"]["by_seed"][0]["wins"] == 16
    assert [s["task"] for s in saved["unplanned"]["scope"]] == ["reverse", "add"]
    assert "| reverse | C1 gmpo > grpo | 20 | 16 | 4 | 0 | 0.0059 |" in text


def _sweep(d, runs: list[tuple[int, float, float, list[float]]]) -> None:  # type: ignore[no-untyped-def]
    """A sweep directory: (seed, warm start, CPU s, reward curve) per grpo run of reverse."""
    d.mkdir()
    records = [{"task": "reverse", "variant": "grpo", "lr": 2e-3, "grad_clip": None, "seed": s,
                "start_reward": w, "final_reward": c[-1], "peak_reward": max(c), "cpu_s": cpu}
               for s, w, cpu, c in runs]  # fmt: skip
    (d / "summary.json").write_text(json.dumps(records))
    write_curves(d, [{"variant": "grpo", "lr": 2e-3, "grad_clip": None, "seed": s,
                      "curves": {"reward": c}} for s, _, _, c in runs])  # fmt: skip


def test_reruns_are_compared_record_and_curve(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from studies.stability import reruns

    _sweep(tmp_path / "grid", [(0, 0.2, 10.0, [0.2, 0.5]), (1, 0.3, 10.0, [0.3, 0.1])])
    # seed 0 again on another CPU budget: identical; seed 1: the last step of its curve differs
    _sweep(tmp_path / "a", [(0, 0.2, 99.0, [0.2, 0.5]), (1, 0.3, 10.0, [0.3, 0.2])])
    _sweep(tmp_path / "b", [(1, 0.25, 10.0, [0.3, 0.2]), (7, 0.1, 1.0, [0.0])])
    argv = [str(tmp_path / "grid"), "--reruns", str(tmp_path / "a"), str(tmp_path / "b"),
            "--out", str(tmp_path / "out")]  # fmt: skip
    assert reruns.main(argv) == 0
    out = reruns.compare(reruns.load(tmp_path / "grid"),
                         {n: reruns.load(tmp_path / n) for n in ("a", "b")})  # fmt: skip
    assert [(r["rerun"], r["key"][-1], r["identical"]) for r in out["against_grid"]] == [
        ("a", 0, True), ("a", 1, False), ("b", 1, False)]  # fmt: skip
    # a and b agree on seed 1's curve but not on its warm start
    assert [(r["key"][-1], r["identical"]) for r in out["between_reruns"]] == [(1, False)]
    assert [(w["rerun"], w["seed"], w["grid"], w["again"]) for w in out["warm_starts"]] == [
        ("a", 0, 0.2, 0.2), ("a", 1, 0.3, 0.3), ("b", 1, 0.3, 0.25)]  # fmt: skip
    text = (tmp_path / "out" / "reruns.md").read_text()
    assert "| a | reverse | grpo | 0.002 | none | 1 | 0.3000, 0.3000 | 0.1000, 0.2000 |" in text
    assert "| b | reverse | 1 | 0.3000 | 0.2500 | no |" in text
