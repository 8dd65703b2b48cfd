"""The regime study's real-model cross-check (studies/stability/updates_real.py): its commands are
the plan's erratum's, its regime u* follows the erratum's rule, its budget rule is the plan's, and
its report reads `gmpo compare`'s summary.json (made-up numbers, each difference worked out by
hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from studies.stability import updates
from studies.stability import updates_real as real
from studies.stability.updates_analysis import group_name

ROOT = Path(__file__).resolve().parents[2]


def _primary(diffs: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """A primary table with GMPO's mean difference against dapo_trl per regime and task."""
    return {f"{group_name(task, u)}: gmpo vs dapo_trl": {"mean_diff": d, "verdict": "same"}
            for u, per_task in diffs.items()
            for task, d in zip(("reverse", "spell_backward"), per_task, strict=True)}  # fmt: skip


def test_u_star_is_the_regime_of_the_largest_averaged_difference() -> None:
    primary = _primary({1: (0.25, 0.25), 2: (0.5, 0.0), 4: (0.0, 0.5), 16: (-0.5, 0.5)})
    assert real.averaged_differences(primary) == {1: 0.25, 2: 0.25, 4: 0.25, 16: 0.0}
    assert real.u_star(primary) == 4  # a three-way tie: the larger number of updates
    assert real.regimes(primary) == [1, 4]
    primary = _primary({1: (0.02, 0.01), 2: (0.0, 0.0), 4: (0.0, 0.0), 16: (0.05, -0.04)})
    assert real.u_star(primary) == 1 and real.regimes(primary) == [1]


def test_the_committed_primary_table_gives_one_update_only() -> None:
    """The erratum's reading of the grid: the averaged difference is largest at 1 update."""
    primary = json.loads((ROOT / "results/updates/updates.json").read_text())["primary"]
    diffs = real.averaged_differences(primary)
    assert max(diffs, key=lambda u: diffs[u]) == 1 and diffs[16] < 0
    assert real.regimes(primary) == [1]


def test_the_flags_are_the_erratas_table() -> None:
    """Each regime's flags and optimizer steps are the plan's erratum's, word for word."""
    text = (ROOT / "docs/regime_plan.md").read_text().split("## Erratum, 2026-12-04", 1)[1]
    rows = re.findall(r"^ *\| (\d+) \| `([^`]+)` \| (\d+) \|$", text, flags=re.M)
    assert {int(u): flags for u, flags, _ in rows} == real.FLAGS
    for u, flags, steps in rows:
        assert f"--max_steps {steps}" in flags and int(steps) == 20 * int(u)
    assert (
        "`.venv/bin/gmpo compare --task chat_chain_sum --against dapo_trl --seed S --seeds 1"
        in text
    )


def test_dry_run_prints_the_erratas_commands(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "updates.json").write_text(json.dumps({"primary": _primary(
        {1: (0.0, 0.0), 2: (0.0, 0.01), 4: (0.0, 0.0), 16: (0.0, 0.0)})}))  # fmt: skip
    updates.main(["real", "--dry-run", "--results", str(tmp_path), "--runs", str(tmp_path / "r"),
                  "--gmpo", ".venv/bin/gmpo"])  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6  # 1 update, then u* = 2, three seeds each
    assert out[0] == (".venv/bin/gmpo compare --task chat_chain_sum --against dapo_trl --seed 6100 "
                      f"--seeds 1 --num_iterations 1 --max_steps 20 --output_dir {tmp_path}/r/real/"
                      "u1/seed6100")  # fmt: skip
    assert out[5].endswith(f"--seed 6102 --seeds 1 {real.FLAGS[2]} --output_dir "
                           f"{tmp_path}/r/real/u2/seed6102")  # fmt: skip
    assert not (tmp_path / "r").exists()  # nothing ran


def test_a_seed_starts_only_where_the_longest_seed_still_fits() -> None:
    assert real.fits([])
    one = {"regime": "u1", "seed": 6100, "rc": 0, "start": "", "end": "", "seconds": 3600}
    assert real.fits([one, {**one, "seconds": 4500}])  # 8100 s + 4500 s = 3.5 h exactly
    assert not real.fits([one, {**one, "seconds": 4600}])  # 8200 s + 4600 s > 3.5 h


def _summary(gmpo: tuple[float, float, float], dapo: tuple[float, float, float]) -> dict[str, Any]:
    """gmpo compare's summary.json, reduced to what the report reads: per loss its run summary
    (held-out reward and right, after) and its outcome (final reward)."""

    def run(final: float, reward: float, right: float) -> dict[str, Any]:
        return {"held_out_reward_before": 0.2, "held_out_right_before": 0.1,
                "held_out_reward_after": reward, "held_out_right_after": right, "final": final}  # fmt: skip

    runs = {"GMPO": [run(*gmpo)], "DAPO_TRL": [run(*dapo)]}
    return {"runs": runs,
            "outcomes": {k: [{"seed": 0, "final": v[0]["final"]}] for k, v in runs.items()}}  # fmt: skip


def test_the_report_gives_each_seeds_differences(tmp_path: Path) -> None:
    runs, results = tmp_path / "runs", tmp_path / "results"
    for seed, s in ((6100, _summary((0.5, 0.75, 0.5), (0.25, 0.5, 0.25))),
                    (6102, _summary((0.25, 0.5, 0.25), (0.5, 0.5, 0.5)))):  # fmt: skip
        (runs / "u1" / f"seed{seed}").mkdir(parents=True)
        (runs / "u1" / f"seed{seed}" / "summary.json").write_text(json.dumps(s))
        (runs / "u1" / f"seed{seed}" / "summary.md").write_text("table\n")
    (runs / "wall.tsv").write_text("u1\t6100\t0\ta\tb\t700\nu1\t6101\tnot run (budget)\n"
                                   "u1\t6102\t0\tc\td\t800\ndone\n")  # fmt: skip
    primary = _primary({1: (0.001, -0.003), 2: (0, 0), 4: (0, 0), 16: (0, 0)})
    real.report(runs, results, primary)
    data = json.loads((results / "real.json").read_text())
    rows = data["regimes"]["u1"]["seeds"]
    assert [r["diff_final"] for r in rows] == [0.25, -0.25]
    assert [r["diff_held_out_reward"] for r in rows] == [0.25, 0.0]
    assert [r["diff_held_out_right"] for r in rows] == [0.25, -0.25]
    assert [r["wall_s"] for r in rows] == [700, 800]
    assert data["regimes"]["u1"]["not_run"] == [6101]
    md = (results / "real.md").read_text()
    assert (
        "| 6100 | 0.500 | 0.250 | +0.250 | 0.750 (0.500) | 0.500 (0.250) | +0.250 (+0.250) |" in md
    )
    assert "final +0.0000 (equal), held-out +0.1250 (GMPO higher)" in md
    assert (
        "GMPO higher on 1 of 2 seeds (final), 1 of 2 (held-out). Wall-clock 1500 s (25.0 min)" in md
    )
    assert "reverse +0.0010 (GMPO higher, verdict same); spell_backward -0.0030 (GMPO lower" in md
    assert "Not run (the budget, or not finished): seeds 6101." in md
    assert (results / "u1" / "seed6102" / "summary.md").read_text() == "table\n"
    assert (results / "wall.tsv").exists()
