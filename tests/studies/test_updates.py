"""The regime study's runner and planned analysis (studies/stability/updates.py,
docs/regime_plan.md) on made-up records, each answer worked out by hand; the regimes' update
counts; the losses' gradients at one update; and the seeds' freshness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import studies.stability.run as run_module
from gmpo_tasks.chars import encode
from gmpo_variants import Variant
from studies.stability import updates, which_loss
from studies.stability import updates_analysis as analysis
from studies.stability import updates_plan as plan
from studies.stability import updates_timing as timing
from studies.stability.model import completion_logps
from studies.stability.run import Setup, group_advantages, rl_run, roll_out

ROOT = Path(__file__).resolve().parents[2]


def _run(variant: str, lr: float, seed: int, final: float, **kw: Any) -> dict[str, Any]:
    base = {"task": "t", "variant": variant, "lr": lr, "grad_clip": None, "seed": seed,
            "final_reward": final, "start_reward": 0.2, "failed": final < 0.2,
            "spread_all": 1.0, "entropy_all": 0.5, "length_all": 3.0}  # fmt: skip
    return {**base, **kw}


def _pilot(medians_of: dict[tuple[str, float], tuple[float, ...]]) -> list[dict[str, Any]]:
    return [_run(v, lr, s, f) for (v, lr), fs in medians_of.items() for s, f in enumerate(fs)]


def test_the_pilot_rule_picks_the_documented_rate() -> None:
    # three pilot seeds a cell; the rule: the highest median final reward, the lower rate on a
    # tie, over the rates each loss ran
    lo, mid, hi = 1e-3, 2e-3, 4e-3  # three rates of the ladder
    records = _pilot({
        # gmpo: medians 0.75, 0.8, 0.1 -> 2e-3 (by the means, 0.75, 0.63, 0.38, it would be 1e-3)
        ("gmpo", lo): (0.75,) * 3, ("gmpo", mid): (0.9, 0.2, 0.8), ("gmpo", hi): (0.95, 0.1, 0.1),
        # grpo: 0.7 at 1e-3 and at 2e-3 -> the lower, 1e-3
        ("grpo", lo): (0.7, 0.7, 0.1), ("grpo", mid): (0.1, 0.7, 0.9), ("grpo", hi): (0.2, 0.2, 0.2),
        # dapo_trl: rising to the highest rate it ran -> 4e-3, on its edge
        ("dapo_trl", lo): (0.1,) * 3, ("dapo_trl", mid): (0.2,) * 3, ("dapo_trl", hi): (0.3,) * 3,
    })  # fmt: skip
    out = plan.pick(records)
    assert out["rates"] == {"dapo_trl": hi, "gmpo": mid, "grpo": lo}
    assert out["edge"] == {"dapo_trl": "high", "grpo": "low"}
    assert out["medians"]["gmpo"] == {repr(lo): 0.75, repr(mid): 0.8, repr(hi): 0.1}


def test_the_pilot_extends_past_the_ladders_edge_at_most_twice() -> None:
    top, bottom = plan.LADDER[-1], plan.LADDER[0]
    ladder = {**{("gmpo", lr): (0.1,) * 3 for lr in plan.LADDER},
              ("gmpo", top): (0.9,) * 3, ("grpo", bottom): (0.9,) * 3,
              **{("grpo", lr): (0.1,) * 3 for lr in plan.LADDER[1:]},
              **{("gspo", lr): (0.1,) * 3 for lr in plan.LADDER}}  # fmt: skip
    ladder[("gspo", plan.LADDER[4])] = (0.5,) * 3  # inside the ladder: not extended
    records = _pilot(ladder)
    assert plan.extension(records) == [("gmpo", 2 * top), ("grpo", bottom / 2)]
    # extended, gmpo is best at twice the top: extended once more; grpo is not, it stays
    records += _pilot({("gmpo", 2 * top): (0.95,) * 3, ("grpo", bottom / 2): (0.5,) * 3})
    assert plan.extension(records) == [("gmpo", 4 * top)]
    records += _pilot({("gmpo", 4 * top): (0.97,) * 3})
    assert plan.extension(records) == []  # EXTEND = 2 doublings: no further
    out = plan.pick(records)
    assert out["rates"]["gmpo"] == 4 * top and out["edge"]["gmpo"] == "high"
    assert out["rates"]["grpo"] == bottom and "grpo" not in out["edge"]


def _outcome(rates: dict[str, float]) -> dict[str, Any]:
    return {"tasks": {t: {plan.regime_name(u): {"rates": rates, "edge": {}, "medians": {}}
                          for u in plan.REGIMES} for t in plan.TASKS}}  # fmt: skip


def test_the_grid_runs_each_loss_at_its_own_rate(tmp_path: Path, capsys: Any) -> None:
    rates = {"gmpo": 4e-3, "grpo": 2e-3, "dapo_trl": 2e-3, "gspo": 8e-3, "cispo_trl": 1e-3}
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "pilot.json").write_text(json.dumps(_outcome(rates)))
    updates.main(["grid", "--robustness", "--dry-run", "--results", str(tmp_path),
                  "--runs", "runs/x"])  # fmt: skip
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 2 * len(plan.TASKS) * len(plan.REGIMES)  # primary, then robust
    seeds = ",".join(str(s) for s in range(6000, 6016))
    first = commands[0].split()
    assert first[first.index("--seeds") + 1] == seeds
    assert first[first.index("--setup") + 1] == "minibatches=1,epochs=1"
    # at 1 update the sanity row: grpo at gmpo's rate too
    assert first[first.index("--cells") + 1] == (
        "gmpo=0.004,grpo=0.002,dapo_trl=0.002,gspo=0.008,cispo_trl=0.001,grpo=0.004"
    )
    u16 = commands[3].split()
    assert u16[u16.index("--setup") + 1] == "minibatches=8,epochs=2"
    assert u16[u16.index("--cells") + 1] == (
        "gmpo=0.004,grpo=0.002,dapo_trl=0.002,gspo=0.008,cispo_trl=0.001"
    )
    assert u16[u16.index("--out") + 1] == "runs/x/reverse/u16"
    # the robustness pass: the same sweeps again with each loss at twice its rate added (grpo
    # at 0.004 is there already at 1 update)
    robust = commands[len(commands) // 2].split()
    assert robust[robust.index("--cells") + 1].endswith(
        "grpo=0.004,gmpo=0.008,dapo_trl=0.004,gspo=0.016,cispo_trl=0.002"
    )


@pytest.fixture
def few_resamples(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap with 200 resamples (the made-up differences are constant or +-0.001, so
    every interval is the same as with the plan's 10,000): seconds, not tens of them."""
    real = which_loss.bootstrap_ci
    monkeypatch.setattr(which_loss, "bootstrap_ci", lambda xs: real(xs, resamples=200))


def _grid(tmp_path: Path, finals: dict[str, Any]) -> Path:
    """A results folder: every task and regime with the losses at the pilot's rates on 16 seeds;
    ``finals[loss](seed, updates)`` gives the final reward."""
    rates = {"gmpo": 4e-3, "grpo": 2e-3, "dapo_trl": 2e-3, "gspo": 8e-3, "cispo_trl": 1e-3}
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "pilot.json").write_text(json.dumps(_outcome(rates)))
    for task in plan.TASKS:
        for u in plan.REGIMES:
            records = [_run(v, lr, s, finals[v](s, u), task=task)
                       for v, lr in updates.grid_cells(rates, u, False)
                       for s in plan.GRID_SEEDS]  # fmt: skip
            d = tmp_path / task / plan.regime_name(u)
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(records))
    return tmp_path


def test_the_analysis_tests_each_regime_with_holm_over_the_plan(
    tmp_path: Path, few_resamples: None
) -> None:
    # gmpo 0.6 on every seed and regime; grpo the same at 1 update (the sanity row passes) and
    # 0.4 elsewhere; dapo_trl 0.5 (0.1 below), gspo 0.6 + 0.001 * (seed parity): the same within
    # noise; cispo_trl 0.7, higher than gmpo
    finals = {"gmpo": lambda s, u: 0.6, "grpo": lambda s, u: 0.6 if u == 1 else 0.4,
              "dapo_trl": lambda s, u: 0.5,
              "gspo": lambda s, u: 0.6 + (0.001 if s % 2 else -0.001),
              "cispo_trl": lambda s, u: 0.7}  # fmt: skip
    out, lines = analysis.analyze(_grid(tmp_path, finals))
    primary = out["primary"]
    assert len(primary) == len(plan.TASKS) * len(plan.REGIMES) * 4  # 32: the plan's family
    row = primary["reverse, 4 updates: gmpo vs dapo_trl"]
    # 16 of 16 seeds: p = 2 * 2^-16; Holm over the 32 rows, 22 of them at that p (grpo at 2, 4
    # and 16 updates, dapo_trl and cispo_trl everywhere): the smallest times 32 for all 22
    assert (row["seeds"], row["wins"], row["losses"]) == (16, 16, 0)
    assert row["holm"] == pytest.approx(32 * 2 / 2**16)
    assert row["verdict"] == "helps" and row["mean_diff"] == pytest.approx(0.1)
    assert primary["reverse, 1 update: gmpo vs grpo"]["verdict"] == "same"  # all 16 tied
    assert primary["reverse, 2 updates: gmpo vs grpo"]["verdict"] == "helps"
    assert primary["spell_backward, 4 updates: gmpo vs gspo"]["verdict"] == "same"
    assert primary["spell_backward, 16 updates: gmpo vs cispo_trl"]["verdict"] == "hurts"
    # a row that hurts in the users' regimes: the answer is mixed
    assert out["headline"].startswith("mixed")
    assert out["sanity"]["reverse"]["passed"] and out["sanity"]["reverse"]["equal_seeds"] == 16
    assert len(out["failures"]) == 32 and "robustness" not in out
    assert "| reverse, 4 updates: gmpo vs dapo_trl | 16 | 16 | 0 | 0 |" in "\n".join(lines)
    # the regime x loss table: each loss's mean over its 16 seeds at its own rate
    means = out["means"]["reverse, 2 updates"]
    assert means["grpo"]["mean"] == pytest.approx(0.4) and means["grpo"]["seeds"] == 16
    assert means["gspo"]["mean"] == pytest.approx(0.6) and means["gspo"]["sd"] > 0
    assert means["cispo_trl"]["rate"] == 1e-3 and means["gmpo"]["rate"] == 4e-3
    assert (
        "| reverse, 2 updates | 0.600 ± 0.000, 0 failed, lr 0.004 | 0.400 ± 0.000, 0 failed, "
        "lr 0.002 |"
    ) in "\n".join(lines)


def test_the_headline_and_the_verdicts_follow_the_plans_numbers(
    tmp_path: Path, few_resamples: None
) -> None:
    finals = {"gmpo": lambda s, u: 0.6, "grpo": lambda s, u: 0.6 if u == 1 else 0.55,
              "dapo_trl": lambda s, u: 0.6 if u == 1 else 0.5,
              "gspo": lambda s, u: 0.6, "cispo_trl": lambda s, u: 0.6}  # fmt: skip
    out, _ = analysis.analyze(_grid(tmp_path, finals))
    assert out["headline"] == "GMPO helps at the settings users run"
    # no helps row below the effect the plan asks for (0.02): significant, but "inconclusive"
    t = {"wins": 16, "losses": 0, "ci": [0.01, 0.015], "mean_diff": 0.012, "holm": 1e-4}
    assert analysis.verdict(t) == "inconclusive"
    assert analysis.verdict({**t, "mean_diff": 0.02, "ci": [0.015, 0.025]}) == "helps"
    wide = {"wins": 9, "losses": 7, "ci": [-0.06, 0.04], "mean_diff": -0.01, "holm": 1.0}
    assert analysis.verdict(wide) == "inconclusive"  # not the same: the interval passes -0.05
    assert analysis.verdict({**wide, "ci": [-0.05, 0.04]}) == "same"


@pytest.mark.parametrize("count", sorted(plan.REGIMES))
def test_each_regime_takes_its_count_of_updates_a_batch(
    count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regime's ``--setup`` gives exactly its number of loss calls (Adam updates) per RL step."""
    calls: list[int] = []

    def counting(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor):  # type: ignore[no-untyped-def]
        calls.append(1)
        return (logp * 0).sum()

    minibatches, epochs = plan.REGIMES[count]
    setup = Setup(length=2, warm_steps=0, prompts=4, group=4, minibatches=minibatches,
                  epochs=epochs, steps=2)  # fmt: skip
    assert plan.setup_of(count) == f"minibatches={minibatches},epochs={epochs}"
    torch.manual_seed(0)
    warm = {"state": setup.model().state_dict()}
    monkeypatch.setattr(run_module, "resolve", lambda name: Variant(name, name, counting))
    rl_run(setup, warm, "counting", 1e-3, None, 0)
    assert len(calls) == 2 * count  # two RL steps


def _one_update(task: str) -> dict[str, torch.Tensor]:
    """Each loss's gradient on one sampled batch of the study's model, on-policy: the old
    log-probs are the sampling policy's, the model unchanged since (the first update of a batch,
    the only one at 1 update)."""
    pytest.importorskip("verl")
    from gmpo_variants import resolve

    torch.manual_seed(0)
    setup = Setup.of(task, prompts=8, group=4)
    model = setup.model()
    prompts = [p for p in setup.task.prompts(8, seed="grad") for _ in range(4)]
    out = roll_out(model, setup, prompts, torch.Generator().manual_seed(0))
    ids = torch.tensor([encode(p, setup.vocab) for p in prompts])
    rewards = torch.rand(len(prompts), generator=torch.Generator().manual_seed(1))
    adv = group_advantages(rewards, 4)
    grads = {}
    for name in plan.LOSSES:
        model.zero_grad(set_to_none=True)
        logp = completion_logps(model, ids, out.sample.completions)
        loss, _ = resolve(name)(logp, out.sample.logps, adv, out.mask)
        loss.backward()
        grads[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return grads


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-7))


@pytest.mark.verl
def test_at_one_update_every_loss_has_gmpos_gradient_on_answers_of_one_length() -> None:
    """The sanity row's reason: on-policy every ratio is 1, and on ``reverse`` (every answer
    16 tokens) the five losses' gradients are the same, -mean_i A_i mean_t grad log pi."""
    grads = _one_update("reverse")
    assert float(grads["gmpo"].abs().max()) > 1e-4  # not vacuous
    for name in plan.LOSSES[1:]:
        assert _close(grads[name], grads["gmpo"]), name


@pytest.mark.verl
def test_at_one_update_gmpo_is_grpo_and_gspo_where_answers_vary_in_length() -> None:
    """With answers of varying length (``spell_backward``) the per-sequence losses (gmpo, grpo,
    gspo) share one gradient and the token-mean ones (dapo_trl, cispo_trl) another."""
    pytest.importorskip("reasoning_gym")  # spell_backward: a gym task
    grads = _one_update("spell_backward")
    assert _close(grads["grpo"], grads["gmpo"]) and _close(grads["gspo"], grads["gmpo"])
    assert _close(grads["cispo_trl"], grads["dapo_trl"])
    assert not _close(grads["dapo_trl"], grads["gmpo"])


def _seeds(x: Any, out: set[int]) -> set[int]:
    """Every integer under a ``seed`` or ``seeds`` key anywhere in a JSON value."""
    if isinstance(x, dict):
        for k, v in x.items():
            if k in ("seed", "seeds"):
                for s in v if isinstance(v, list) else [v]:
                    if isinstance(s, int):
                        out.add(s)
            _seeds(v, out)
    elif isinstance(x, list):
        for v in x:
            _seeds(v, out)
    return out


def test_the_plans_seeds_are_fresh() -> None:
    """No pilot or grid seed of the plan is a seed of any committed run of the project (every
    ``seed`` in results/), and the pilot's and the grid's are apart."""
    used: set[int] = set()
    files = [p for p in (ROOT / "results").rglob("*.json") if "updates" not in p.parts]
    for path in files:
        _seeds(json.loads(path.read_text()), used)
    assert {0, 500, 1000, 3900, 4000, 4019} <= used  # the scan finds the earlier studies' seeds
    ours = (set(plan.PILOT_SEEDS), set(plan.GRID_SEEDS), set(plan.CROSS_CHECK_SEEDS))
    assert not used & set.union(*ours)
    assert sum(map(len, ours)) == len(set.union(*ours))  # the three apart
    assert len(plan.GRID_SEEDS) >= 16


def test_the_make_targets_run_the_plans_steps() -> None:
    """`make study-updates-pilot` is the one command that starts the pilot."""
    text = (ROOT / "Makefile").read_text()
    for target, step in (("study-updates-pilot", "pilot"), ("study-updates", "grid"),
                         ("study-updates-analysis", "analysis")):  # fmt: skip
        recipe = text.split(f"\n{target}: setup\n", 1)[1].split("\n\n", 1)[0]
        assert f"\t$(UPDATES) {step}\n" in recipe + "\n", target
    assert "\nUPDATES = $(BIN)/python -m studies.stability.updates\n" in text


def test_dry_run_of_the_pilot_lists_every_loss_and_rate(capsys: Any) -> None:
    updates.main(["pilot", "--dry-run", "--runs", "runs/p", "--results", "/nonexistent"])
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == len(plan.TASKS) * len(plan.REGIMES)
    cells = commands[0].split()[commands[0].split().index("--cells") + 1].split(",")
    assert len(cells) == len(plan.LOSSES) * len(plan.LADDER)
    assert "--seeds 5900,5901,5902" in commands[0]


def test_the_estimate_counts_each_steps_runs_and_warm_starts() -> None:
    rows = [{"task": t, "updates": u, "run_cpu_s": 10.0, "warm_cpu_s": 5.0}
            for t in (*plan.TASKS, plan.EXTRA_TASK) for u in plan.REGIMES]  # fmt: skip
    ratios = {t: {"gmpo": 1.0, "grpo": 1.0, "gspo": 1.5} for t in (*plan.TASKS, "chain_sum")}
    parts = timing.estimate(rows, ratios, {"cpu_per_wall": 2.0})
    pilot = next(e for e in parts if e["step"] == "pilot" and e["task"] == "reverse")
    # 5 losses x 7 rates x 3 seeds x 4 regimes; the mean cost (1 + 1 + 1 + 1.5 + 1) / 5 = 1.1;
    # three warm starts, shared by the regimes
    assert pilot["runs"] == 420
    assert pilot["cpu_s"] == pytest.approx(420 * 10 * 1.1 + 3 * 5)
    assert pilot["wall_s"] == pytest.approx(pilot["cpu_s"] / 2)
    grid = next(e for e in parts if e["step"] == "grid" and e["task"] == "reverse")
    assert grid["runs"] == 4 * 80 + 16  # the sanity cell at 1 update
    assert [r.split(" | ")[1] for r in timing.order_rows(parts)] == ["1752", "640", "876", "320"]


def test_the_regimes_of_a_task_share_its_warm_starts(tmp_path: Path) -> None:
    for u in (1, 16):
        plan.share_warm(tmp_path / "reverse" / plan.regime_name(u))
    plan.share_warm(tmp_path / "reverse" / "u1")  # again: unchanged
    (tmp_path / "reverse" / "u1" / "warm" / "seed.pt").write_text("x")
    assert (tmp_path / "reverse" / "u16" / "warm" / "seed.pt").read_text() == "x"


def test_no_extra_sanity_cell_where_grpo_runs_at_gmpos_rate_already() -> None:
    same = {v: 1e-3 for v in plan.LOSSES}
    assert updates.grid_cells(same, 1, False) == [(v, 1e-3) for v in plan.LOSSES]
    assert updates.grid_cells({**same, "grpo": 2e-3}, 1, False)[-1] == ("grpo", 1e-3)
    assert ("grpo", 1e-3) not in updates.grid_cells({**same, "grpo": 2e-3}, 4, False)


def test_committed_records_are_gzipped_and_read_back(tmp_path: Path) -> None:
    """copy_summaries commits a sweep's summary.json as summary.json.gz (the same bytes on every
    copy); records_of reads either form to the same records."""
    src, dst = tmp_path / "runs", tmp_path / "results"
    src.mkdir()
    records = [{"variant": "gmpo", "seed": s, "final_reward": 0.5 + s / 100} for s in range(40)]
    (src / "summary.json").write_text(json.dumps(records, indent=1) + "\n")
    (src / "summary.md").write_text("# summary\n")
    (src / "invocations.jsonl").write_text("{}\n")
    (dst / "summary.json").parent.mkdir()
    (dst / "summary.json").write_text("[]")  # an older plain copy is replaced
    plan.copy_summaries(src, dst)
    first = (dst / "summary.json.gz").read_bytes()
    plan.copy_summaries(src, dst)
    assert (dst / "summary.json.gz").read_bytes() == first
    assert sorted(p.name for p in dst.iterdir()) == [
        "invocations.jsonl", "summary.json.gz", "summary.md",
    ]  # fmt: skip
    assert plan.has_records(dst) and plan.has_records(src) and not plan.has_records(tmp_path)
    assert plan.records_of(dst) == plan.records_of(src) == records
    assert len(first) < (src / "summary.json").stat().st_size / 3


def test_the_analysis_counts_the_verdicts_the_ceiling_and_the_pilots_spread(
    tmp_path: Path, few_resamples: None
) -> None:
    """The counts the pages write in words (docs/regime.md, README.md, docs/which_loss.md) and
    the ceiling and exploratory spread docs/regime.md quotes come from the analysis."""
    # as in the first analysis test: grpo the same at 1 update and 0.2 below after (2 same, 6
    # helps), dapo_trl 0.1 below (8 helps), gspo within noise (8 same), cispo_trl 0.1 above
    # (8 hurts)
    finals = {"gmpo": lambda s, u: 0.6, "grpo": lambda s, u: 0.6 if u == 1 else 0.4,
              "dapo_trl": lambda s, u: 0.5,
              "gspo": lambda s, u: 0.6 + (0.001 if s % 2 else -0.001),
              "cispo_trl": lambda s, u: 0.7}  # fmt: skip
    results = _grid(tmp_path, finals)
    # the pilot at 16 updates on reverse: gmpo and grpo at one rate, spreads 0.1, 0.2, 0.3 and
    # 0.3, 0.3, 0.3 over three seeds
    pilot = results / "pilot" / "reverse" / plan.regime_name(16)
    pilot.mkdir(parents=True)
    spreads = {"gmpo": (0.1, 0.2, 0.3), "grpo": (0.3, 0.3, 0.3)}
    pilot_runs = [_run(v, 1e-3, s, 0.95 + 0.01 * s, spread_all=x)
                  for v, xs in spreads.items() for s, x in enumerate(xs)]  # fmt: skip
    (pilot / "summary.json").write_text(json.dumps(pilot_runs))
    out, lines = analysis.analyze(results)
    assert out["verdicts"] == {"same": 10, "inconclusive": 0, "helps": 14, "hurts": 8}
    text = "\n".join(lines)
    assert "10 same, 0 inconclusive, 14 helps, 8 hurts of 32." in text
    # helps against dapo_trl (0.5 everywhere) needs a mean of 0.5 + 0.02; the best single run
    # is a pilot run (0.97, seed 2) on reverse, cispo_trl's 0.7 on spell_backward
    assert out["ceiling"]["reverse"]["helps_needs"] == pytest.approx(0.52)
    assert out["ceiling"]["reverse"]["best_run"] == pytest.approx(0.97)
    assert out["ceiling"]["spell_backward"]["best_run"] == pytest.approx(0.7)
    assert out["ceiling"]["reverse"]["runs"] == out["ceiling"]["spell_backward"]["runs"] + 6
    assert out["pilot_spread"] == {
        "reverse": {"0.001": {"gmpo": pytest.approx(0.2), "grpo": pytest.approx(0.3)}}
    }
    assert "| reverse | 0.001 | 0.200 | 0.300 | — | — | — |" in text
