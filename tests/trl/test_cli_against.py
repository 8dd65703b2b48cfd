"""``gmpo compare --against`` (CHANGELOG, Unreleased): the losses users run, each through TRL's own
``GRPOTrainer`` with its ``loss_type`` and its documented settings, beside GMPO on the same task
and seeds; the report's table against GMPO (wins, losses, sign test, failures); the refusals.
``--against grpo``, the default, keeps ``gmpo compare``'s output (tests/trl/test_cli*.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("trl")

from gmpo_trl.cli import main
from gmpo_trl.cli.parsing import parse
from gmpo_trl.cli.reports import against_table, outcome, read_metrics

pytestmark = pytest.mark.trl

PNG = b"\x89PNG\r\n\x1a\n"


def test_compare_against_dapo_and_gspo_end_to_end(tmp_path, capsys):
    """The command of the CHANGELOG's entry (Unreleased), ``gmpo compare --against dapo,gspo
    --max_steps 2``, on 2 seeds: each loss trained by TRL's trainer on the same seeds as GMPO,
    one plot, the table."""
    argv = ["compare", "--against", "dapo,gspo", "--max_steps", "2", "--logging_steps", "1",
            "--seeds", "2", "--output_dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    for name in ("dapo", "gspo", "gmpo"):
        for seed in (0, 1):
            rows = read_metrics(tmp_path / name / f"seed{seed}" / "metrics.jsonl")
            assert [r["step"] for r in rows] == [1, 2] and "reward" in rows[0]
    assert not (tmp_path / "grpo").exists()
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["against"] == ["dapo", "gspo"]
    assert list(summary["against_gmpo"]) == ["DAPO", "GSPO", "GMPO"]
    finals = {m: [o["final"] for o in rows] for m, rows in summary["outcomes"].items()}
    for method in ("DAPO", "GSPO"):
        entry = summary["against_gmpo"][method]
        wins = sum(g > v for g, v in zip(finals["GMPO"], finals[method], strict=True))
        assert entry["wins"] == wins and entry["wins"] + entry["losses"] + entry["ties"] == 2
    # paired: every method's first generation is sampled from the same warm start per seed
    starts = {m: [o["reward_start"] for o in rows] for m, rows in summary["outcomes"].items()}
    assert starts["DAPO"] == starts["GSPO"] == starts["GMPO"]
    settings = summary["settings"]
    assert "DAPO: TRL GRPOTrainer, loss_type='dapo', epsilon=0.2, epsilon_high=0.28" in settings
    assert ("GSPO: TRL GRPOTrainer, loss_type='grpo', importance_sampling_level='sequence', "
            "epsilon=0.0003, epsilon_high=0.0004") in settings  # fmt: skip
    out = capsys.readouterr().out
    assert "| method | seeds | final reward | GMPO wins | GMPO losses | ties |" in out
    assert "gmpo compare (DAPO, seed 1)" in out and "gmpo compare (GSPO, seed 0)" in out
    assert (tmp_path / "summary.md").read_text() in out


_RISING = """
calls = 0

def rising(prompts, completions, **kwargs):
    global calls
    calls += 1
    return [calls / 100] * len(prompts)
"""


def test_one_final_reward_everywhere_and_a_header_that_names_what_ran(
    tmp_path, capsys, monkeypatch
):
    """A user's dataset and reward, 15 logged rewards a run, a reward that rises at every call:
    the per-run line, the table of summaries and the table against GMPO (its wins) give one final
    reward, gmpo_stats.outcome's (the mean of the last 20, here all 15), defined once; the header
    names the dataset and the reward. Regression: the per-run line and the summaries' table gave
    the mean of the last 7 (the caption said 10), the table against GMPO the mean of all 15, and
    the header named the task successor."""
    from gmpo_trl.cli.reports import REWARDS

    (tmp_path / "rising_rewards.py").write_text(_RISING)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{d}="}) + "\n" for d in range(8)))
    out = tmp_path / "out"  # a reward every step: one generation a step
    argv = ["compare", "--against", "dapo", "--dataset", str(data), "--reward",
            "rising_rewards:rising", "--max_steps", "15", "--num_iterations", "1",
            "--steps_per_generation", "1", "--output_dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    for method, name in (("DAPO", "dapo"), ("GMPO", "gmpo")):
        rewards = [r["reward"] for r in read_metrics(out / name / "seed0" / "metrics.jsonl")]
        assert len(rewards) == 15 and len(set(rewards)) == 15  # a mean of 7 differs from 15's
        final = sum(rewards) / 15
        run = summary["runs"][method][0]
        assert (run["reward_first"], run["reward_window"]) == (rewards[0], 15)
        assert run["reward_final"] == pytest.approx(final, rel=1e-12)
        assert summary["outcomes"][method][0]["final"] == pytest.approx(final, rel=1e-12)
        assert summary["aggregate"][method]["reward_final"]["values"] == [run["reward_final"]]
        assert summary["against_gmpo"][method]["final"]["values"] == [run["reward_final"]]
        assert (
            f"reward {rewards[0]:.2f} -> {final:.2f} (the first logged reward, then the final "
            "reward: the mean of the last 15 logged)" in printed
        )
    markdown = (out / "summary.md").read_text()
    assert markdown.startswith(
        f"dataset {data} (split train), reward rising_rewards:rising, the successor task's model; "
    )
    assert markdown.count(REWARDS) == 1 and "last 10" not in markdown
    assert summary["rewards"] == REWARDS


def test_the_table_against_gmpo_on_made_up_runs():
    """Wins, losses and ties on the same seeds, the one-sided sign test and the failures,
    against a count by hand."""
    gmpo = [{"seed": s, "final": f, "failed": False} for s, f in enumerate([0.8, 0.6, 0.5, 0.9])]
    dapo = [{"seed": s, "final": f, "failed": s == 3} for s, f in enumerate([0.7, 0.6, 0.4, 0.1])]
    # SAPO ran seeds 1..3 only: pairs on seeds 1, 2, 3; GMPO wins one, loses two
    sapo = [{"seed": s, "final": f, "failed": True} for s, f in [(1, 0.7), (2, 0.9), (3, 0.2)]]
    table, agg = against_table({"DAPO": dapo, "SAPO": sapo, "GMPO": gmpo})
    # DAPO: GMPO wins seeds 0, 2, 3, ties seed 1: P(X >= 3 | n = 3) = 1/8
    assert (agg["DAPO"]["wins"], agg["DAPO"]["losses"], agg["DAPO"]["ties"]) == (3, 0, 1)
    assert agg["DAPO"]["p"] == 1 / 8 and agg["DAPO"]["failed"] == 1
    # SAPO: P(X >= 1 | n = 3) = 7/8
    assert (agg["SAPO"]["wins"], agg["SAPO"]["losses"], agg["SAPO"]["p"]) == (1, 2, 7 / 8)
    assert table.splitlines() == [
        "| method | seeds | final reward | GMPO wins | GMPO losses | ties | "
        "p (sign test, one-sided) | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        "| DAPO | 4 | 0.45 ± 0.26 | 3 | 0 | 1 | 0.125 | 1/4 |",
        "| SAPO | 3 | 0.60 ± 0.36 | 1 | 2 | 0 | 0.875 | 3/3 |",
        "| GMPO | 4 | 0.70 ± 0.18 | — | — | — | — | 0/4 |",
    ]


def test_a_run_fails_below_its_warm_start_or_when_it_collapses():
    """``outcome``: gmpo_stats.outcome's rule on a run's logged rewards, its first the warm
    start's."""

    def rows(curve):
        return [{"step": i + 1, "reward": r} for i, r in enumerate(curve)]

    assert outcome(rows([0.5, 0.6, 0.7])) == {
        "reward_start": 0.5, "final": pytest.approx(0.6), "peak": pytest.approx(0.6),
        "collapsed": False, "failed": False}  # fmt: skip
    assert outcome(rows([0.5, 0.4, 0.5]))["failed"] is True  # final 0.467 < 0.5
    learned_and_lost = [0.1] * 20 + [0.9] * 20 + [0.5] * 20  # final 0.5 >= start, collapsed
    assert outcome(rows(learned_and_lost))["collapsed"] is True
    assert outcome(rows(learned_and_lost))["failed"] is True
    assert outcome([{"step": 1, "loss": 0.0}]) == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--against", "dapo,ppo"],
         "--against: unknown loss 'ppo' (choose from grpo, dapo, dapo_trl, gspo, cispo, sapo)"),
        (["--against", "dapo,dapo"], "--against: give each loss once, from grpo, dapo, dapo_trl, gspo"),
        (["--against", "dapo", "--grpo_epsilon", "0.1"],
         "--grpo_epsilon is GRPO's clip: add grpo to --against, or leave it out"),
        (["--config", "against.yaml"], "--against: unknown loss 'ppo' (choose from grpo, dapo"),
    ],
)  # fmt: skip
def test_a_loss_that_is_not_offered_is_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "against.yaml").write_text("against: [gspo, ppo]\n")
    full = ["compare", *argv, "--max_steps", "1", "--output_dir", str(tmp_path / "out")]
    assert main(full) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gmpo compare: error: {message}"] or (
        len(err) == 1 and err[0].startswith(f"gmpo compare: error: {message}")
    ), err
    assert not (tmp_path / "out").exists()


def test_each_loss_type_gets_its_documented_settings(tmp_path):
    """Each comparator's GRPOConfig: DAPO's clip (0.2, 0.28), GSPO's sequence-level clip
    (3e-4, 4e-4), CISPO's weight cap 5.0 (TRL's recommendation), SAPO at TRL's defaults, GRPO at
    --grpo_epsilon; GMPO's log-space --epsilon reaches GMPO only, GMPO's variant still applies,
    and every other value is the same for every method."""
    from trl import GRPOConfig

    from gmpo_trl.cli.compare import compare_plan

    argv = ["--against", "dapo,dapo_trl,gspo,cispo,sapo,grpo", "--grpo_epsilon", "0.1", "--variant",
            "gmpo_narrow", "--learning_rate", "0.01", "--output_dir", str(tmp_path)]  # fmt: skip
    plan = compare_plan(parse("compare", argv))
    got = {name: c for name, c in plan.comparators.items()}
    assert list(got) == ["dapo", "dapo_trl", "gspo", "cispo", "sapo", "grpo"]
    assert all(type(c) is GRPOConfig for c in got.values())
    loss = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high")
    assert {n: tuple(getattr(c, k) for k in loss) for n, c in got.items()} == {
        "dapo": ("dapo", "token", 0.2, 0.28),
        "dapo_trl": ("dapo", "token", 0.2, None),  # TRL's default loss: epsilon_high unset
        "gspo": ("grpo", "sequence", 3e-4, 4e-4),
        "cispo": ("cispo", "token", 0.2, 5.0),
        "sapo": ("sapo", "token", 0.2, None),
        "grpo": ("grpo", "token", 0.1, None),
    }
    trl_defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert (trl_defaults["loss_type"], trl_defaults["epsilon"], trl_defaults["epsilon_high"]) == (
        "dapo", 0.2, None)  # fmt: skip
    for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
        assert getattr(got["sapo"], name) == trl_defaults[name]
    assert (trl_defaults["sapo_temperature_pos"], trl_defaults["sapo_temperature_neg"]) == (1, 1.05)
    for c in got.values():  # the run's own values, the same for every method
        assert (c.learning_rate, c.max_steps, c.num_iterations, c.delta, c.beta) == (
            0.01, plan.config.max_steps, plan.config.num_iterations, None, 0.0)  # fmt: skip
    assert plan.config.loss_variant == "gmpo_narrow" and plan.variant is not None
