"""The confirmatory study's pieces (docs/study_plan.md): the failure rule, Holm, the mechanism
metrics of an update, the setup the options build, methods by module:function, and the
analysis on made-up records."""

from __future__ import annotations

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
                out.append({"task": task, "method": m, "lr": 2e-3, "grad_clip": None, "seed": seed,
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

    records = [{"method": "gmpo", "start_reward": 0.2, "final_reward": f, "peak_reward": p,
                "failed": fail} for f, p, fail in ((0.8, 0.9, False), (0.0, 0.6, True), (0.1, 0.3, True))]  # fmt: skip
    (row,) = regime.rows("base", records)
    assert row.startswith("| base | gmpo | 3 |") and row.endswith("| 2/3 | 2/3 |"), row
