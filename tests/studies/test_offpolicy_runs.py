"""The off-policy study's runner (studies/offpolicy/real.py, one.py): a finished run's record is
the unit a step run again skips, a killed run leaves nothing that counts and is run again from
nothing, the grid replaces an excluded seed with a spare, the 1-update arm stops at the budget;
one real process trains the toy task for one optimizer step and writes its record; the regimes'
flags are the regime study's count."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from studies.offpolicy import budget, one, real
from studies.offpolicy import design as d

pytestmark = pytest.mark.trl


def _args(tmp_path: Path, **kw: Any) -> argparse.Namespace:
    base = {
        "task": "chat_arith",
        "runs": tmp_path / "runs",
        "results": tmp_path / "res",
        "dry_run": False,
        "extra": [],
        "workers": 1,
    }
    return argparse.Namespace(**{**base, **kw})


class FakeLaunch:
    """Stands in for a run's process: writes the record one.py would (the endpoint peaks at the
    ladder's middle rate, so no extension), except for the runs in ``kill`` (partial outputs, no
    record, status -9) and with the clip never acting in ``no_clip``'s."""

    def __init__(self, kill: set[tuple[str, int]] = frozenset(), no_clip=frozenset()) -> None:  # type: ignore[assignment]
        self.kill, self.no_clip, self.calls = set(kill), set(no_clip), []

    def __call__(self, argv: list[str], log: Path) -> int:
        assert argv[:3] == [argv[0], "-m", "studies.offpolicy"] and argv[4] == "--started"
        a = one.parser().parse_args(argv[6:] if argv[3] == "one" else argv)
        self.calls.append((a.loss, a.lr, a.seed))
        assert not any(a.out.iterdir())  # started from nothing
        (a.out / "metrics.jsonl").write_text("{}\n")
        if (a.loss, a.seed) in self.kill:
            self.kill.discard((a.loss, a.seed))  # killed once
            return -9
        clip = 0.0 if (a.loss, a.seed) in self.no_clip else 0.01
        rec = {"loss": a.loss, "lr": a.lr, "seed": a.seed, "updates": a.updates, "wall_s": 10.0,
               d.ENDPOINT: 0.5 - abs(a.lr - d.LADDER[1]) * 1e3, d.CLIP_KEY: clip}  # fmt: skip
        (a.out / "record.json").write_text(json.dumps(rec))
        return 0


def test_a_step_run_again_skips_finished_runs_and_reruns_a_killed_one(tmp_path, monkeypatch):
    args = _args(tmp_path)
    fake = FakeLaunch(kill={("gmpo", d.PILOT_SEEDS[1])})
    monkeypatch.setattr(real, "launch", fake)
    real.pilot(args)
    n = len(d.LADDER) * len(d.LOSSES) * len(d.PILOT_SEEDS)
    assert len(fake.calls) == n
    killed = real.run_dir(args.runs, "pilot", ("gmpo", d.LADDER[0], d.PILOT_SEEDS[1]))
    assert (killed / "metrics.jsonl").exists() and not (killed / "record.json").exists()
    assert len(real.records(args.results, "pilot")) == n - 1  # the killed run is not copied
    fake.calls.clear()
    real.pilot(args)  # another session: only the killed run, from nothing
    assert fake.calls == [("gmpo", d.LADDER[0], d.PILOT_SEEDS[1])]
    assert len(real.records(args.results, "pilot")) == n
    attempts = (args.runs / "real" / "attempts.jsonl").read_text().splitlines()
    assert len(attempts) == n + 1 and json.loads(attempts[1])["rc"] == -9
    assert real.spent_s(args.runs) == pytest.approx(sum(json.loads(a)["wall_s"] for a in attempts))
    # the rule on the committed records: the middle rate for both, no edge
    real.rates(args)
    out = json.loads((args.results / "rates.json").read_text())
    assert out["rates"] == {"gmpo": d.LADDER[1], "dapo_trl": d.LADDER[1]} and out["edge"] == {}
    fake.calls.clear()
    real.pilot(args)
    assert fake.calls == []


def test_the_grid_runs_a_spare_for_each_excluded_seed(tmp_path, monkeypatch):
    args = _args(tmp_path)
    args.results.mkdir()
    (args.results / "rates.json").write_text(
        json.dumps({"rates": {"gmpo": 2e-5, "dapo_trl": 1e-5}})
    )
    fake = FakeLaunch(no_clip={("gmpo", d.GRID_SEEDS[3]), ("dapo_trl", d.SPARE_SEEDS[0])})
    monkeypatch.setattr(real, "launch", fake)
    real.grid(args)
    seeds = [s for _, _, s in fake.calls]
    # 12 seeds; 8103 excluded -> the first spare, itself excluded -> the second; then 12 count
    assert seeds == [s for s in d.GRID_SEEDS for _ in d.LOSSES] + [d.SPARE_SEEDS[0]] * 2 + [
        d.SPARE_SEEDS[1]] * 2  # fmt: skip
    assert {(loss, lr) for loss, lr, _ in fake.calls} == {("gmpo", 2e-5), ("dapo_trl", 1e-5)}
    ok, out = d.counted(real.records(args.results, "grid"), d.GRID_SEEDS + d.SPARE_SEEDS)
    assert len(ok) == 12 and out == [d.GRID_SEEDS[3], d.SPARE_SEEDS[0]]


def test_the_arm_stops_where_the_budget_ends(tmp_path, monkeypatch):
    args = _args(tmp_path)
    args.results.mkdir()
    (args.results / "rates.json").write_text(
        json.dumps({"rates": {"gmpo": 2e-5, "dapo_trl": 1e-5}})
    )
    m = {"run_1u": 500.0, "run_4u": 1000.0, "tiny": {"runs": 1, "wall_s": 1.0}}
    monkeypatch.setattr(budget, "measured", lambda _: m)
    fake = FakeLaunch()
    monkeypatch.setattr(real, "launch", fake)
    (args.runs / "real").mkdir(parents=True)
    # 7.5 h spent; a seed's estimate 2 x 500 s: 7.78 h, then 8.06 h: one seed fits
    (args.runs / "real" / "attempts.jsonl").write_text(json.dumps({"wall_s": 7.5 * 3600}) + "\n")
    monkeypatch.setattr(real, "spent_s", lambda runs: 7.5 * 3600 + 500 * len(fake.calls))
    real.arm(args)
    assert [s for _, _, s in fake.calls] == [d.GRID_SEEDS[0]] * 2


def test_one_process_trains_the_toy_task_and_its_record_counts(tmp_path):
    """The real launcher and process, one optimizer step of the toy task at 4 updates a batch
    (the record's flags are the regime's), then the step again: nothing runs."""
    args = _args(tmp_path, task="successor")
    args.extra = ["--max_steps", "1"]
    cell = ("dapo_trl", 1e-3, 1)
    real.run_cells(args, "grid", [cell])
    out = real.run_dir(args.runs, "grid", cell)
    rec = json.loads((out / "record.json").read_text())
    assert (rec["loss"], rec["lr"], rec["seed"], rec["updates"]) == ("dapo_trl", 1e-3, 1, 4)
    assert rec["optimizer_steps"] == 1 and rec["curves"]["step"] == [1]
    assert rec["flags"][rec["flags"].index("--steps_per_generation") + 1] == "4"
    assert rec[d.CLIP_KEY] == 0.0 and not d.clip_acted(rec)  # one on-policy step: no clip
    assert rec[d.ENDPOINT] is None  # the toy task has no held-out split
    assert rec["wall_s"] > 0 and (out / "metrics.jsonl").exists()
    before = (out / "record.json").read_text()
    real.run_cells(args, "grid", [cell])
    assert (out / "record.json").read_text() == before
    assert len((args.runs / "real" / "attempts.jsonl").read_text().splitlines()) == 1


def test_the_dry_run_prints_the_pilots_processes(tmp_path, capsys):
    real.pilot(argparse.Namespace(**{**vars(_args(tmp_path)), "dry_run": True}))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(d.LADDER) * len(d.LOSSES) * len(d.PILOT_SEEDS)
    first = shlex.split(lines[0])
    assert first[1:] == ["-m", "studies.offpolicy", "one", "--task", "chat_arith", "--loss", "gmpo",
                         "--lr", "1e-05", "--seed", "8000", "--updates", "4", "--out",
                         str(tmp_path / "runs/real/pilot/gmpo_lr1e-05_seed8000")]  # fmt: skip
    assert not (tmp_path / "runs").exists()


def test_the_regimes_flags_are_the_regime_studys_count() -> None:
    """On chat_chain_sum's settings (16 completions a generation, 20 generations), 4 and 1
    updates are the regime study's erratum's flags."""
    pytest.importorskip("reasoning_gym")
    from gmpo_trl.cli.parsing import parse
    from studies.stability.updates_real import FLAGS

    shape = one.generation_shape(parse("compare", ["--task", "chat_chain_sum"]))
    assert shape == (16, 20)

    def pairs(flags: list[str]) -> dict[str, str]:
        return dict(zip(flags[::2], flags[1::2], strict=True))

    # the erratum's, and one optimizer step a minibatch (no accumulation, GRPOConfig's default)
    for u in (1, 4):
        assert pairs(d.regime_flags(u, *shape)) == {
            "--per_device_train_batch_size": str(16 // u), "--gradient_accumulation_steps": "1",
            "--steps_per_generation": str(u), **pairs(shlex.split(FLAGS[u]))}  # fmt: skip
    with pytest.raises(ValueError, match="do not split into 8"):
        d.regime_flags(16, 12, 20)


def test_chain_sums_part_is_the_regime_studys_sweep_and_obeys_the_budget(
    tmp_path, monkeypatch, capsys
):
    from studies.offpolicy import tiny

    args = _args(tmp_path, dry_run=True)
    tiny.tiny_pilot(args)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(d.TINY_REGIMES)
    words = shlex.split(lines[2])
    assert words[words.index("--setup") + 1] == "minibatches=4,epochs=1"
    assert words[words.index("--seeds") + 1] == "8200,8201,8202"
    cells = words[words.index("--cells") + 1].split(",")
    assert len(cells) == 2 * 7 and {c.split("=")[0] for c in cells} == {"gmpo", "dapo_trl"}
    # not a dry run: 7.9 h spent and an estimate of 0.2 h: dropped, nothing runs
    monkeypatch.setattr(budget, "measured", lambda _: {"tiny": {"wall_s": 0.2 * 3600}})
    monkeypatch.setattr(tiny, "spent_s", lambda runs: 7.9 * 3600)
    monkeypatch.setattr(tiny, "run_sweep", lambda *a: pytest.fail("ran a sweep"))
    tiny.tiny_pilot(_args(tmp_path))
    assert (tmp_path / "res" / "tiny" / "budget.txt").read_text() == (
        "spent 7.90 h + estimate 0.20 h > 8 h: dropped\n"
    )
