"""``gmpo train --resume_from_checkpoint`` (CHANGELOG, 0.2): it resumes, metrics.jsonl keeps
the earlier rows, and a checkpoint that is not there is one line and exit 2.

The runs are the toy run (4 steps, a checkpoint every 2; its default layout generates every 4
steps, so checkpoint-2 falls inside a generation's buffer) on the CPU: seeded model, data and
sampling, restored weights, optimizer, RNG and buffered rollouts, hence rows equal to the
straight run's (timing left out).
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("trl")

from gmpo_trl import GMPOTrainer
from gmpo_trl.cli import main
from gmpo_trl.cli.reports import read_metrics

pytestmark = pytest.mark.trl

RUN = ["--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2"]
TIMING = {"step_time"}


def rows_of(out) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(out / "metrics.jsonl")
    ]


def files(folder) -> dict[str, tuple[bytes, int]]:
    """Every file of a folder: its bytes and its modification time (ns)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The straight 4-step run (trained once): its output directory."""
    out = tmp_path_factory.mktemp("straight") / "out"
    assert main(["train", "--output_dir", str(out), *RUN]) == 0
    assert [r["step"] for r in rows_of(out)] == [1, 2, 3, 4]
    return out


@pytest.fixture
def counted_steps(monkeypatch):
    """The optimizer steps a run trains (GMPOTrainer.training_step calls; one per step here)."""
    steps: list[int] = []
    original = GMPOTrainer.training_step

    def training_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        steps.append(self.state.global_step + 1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GMPOTrainer, "training_step", training_step)
    return steps


def test_resume_from_checkpoint_trains_the_remaining_steps(
    tmp_path, straight, counted_steps, capsys
):
    out = tmp_path / "out"
    shutil.copytree(straight, out)
    before = files(out / "checkpoint-2")
    final_weights = (out / "checkpoint-4" / "model.safetensors").read_bytes()
    argv = ["train", "--output_dir", str(out), *RUN,
            "--resume_from_checkpoint", str(out / "checkpoint-2")]  # fmt: skip
    assert main(argv) == 0
    assert counted_steps == [3, 4]  # steps 1-2 are not trained again
    printed = capsys.readouterr().out
    assert f"resuming from {out / 'checkpoint-2'} at step 2 of 4" in printed
    assert rows_of(out) == rows_of(straight)  # steps 1..4, once each, equal to the straight run's
    assert files(out / "checkpoint-2") == before  # not rewritten
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (out / "checkpoint-4" / "model.safetensors").read_bytes() == final_weights


def test_resume_true_takes_the_last_checkpoint_and_replaces_later_rows(
    tmp_path, straight, counted_steps
):
    """``true``: the last checkpoint in --output_dir (here checkpoint-2, as after a run stopped
    past step 2 and before step 4's checkpoint); the rows of steps 3-4 already written are
    replaced by the resumed run's, so that each step appears once."""
    out = tmp_path / "out"
    shutil.copytree(straight, out)
    shutil.rmtree(out / "checkpoint-4")
    with (out / "metrics.jsonl").open("a") as f:  # a row the stopped run wrote after step 2
        f.write('{"step": 3, "reward": 99.0, "log_ratio/min": 0.0}\n')
    assert main(["train", "--output_dir", str(out), *RUN, "--resume_from_checkpoint", "true"]) == 0
    assert counted_steps == [3, 4]
    assert rows_of(out) == rows_of(straight)


# Regression (CHANGELOG, Unreleased): the state file is written after TRL's own files, so a run
# killed during its save leaves a checkpoint that --resume_from_checkpoint true picks, with an
# empty gmpo_trainer_state_0.pt: resuming raised EOFError.
def test_resume_true_past_an_empty_state_file(tmp_path, straight, counted_steps, recwarn):
    out = tmp_path / "out"
    shutil.copytree(straight, out)
    shutil.rmtree(out / "checkpoint-4")
    (out / "checkpoint-2" / "gmpo_trainer_state_0.pt").write_bytes(b"")
    assert main(["train", "--output_dir", str(out), *RUN, "--resume_from_checkpoint", "true"]) == 0
    assert counted_steps == [3, 4]
    assert [r["step"] for r in rows_of(out)] == [1, 2, 3, 4]
    given = [str(w.message) for w in recwarn if "gmpo_trl" in str(w.message)]
    assert len(given) == 1 and "resuming as GRPOTrainer does" in given[0], given


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("{tmp}/no/such/checkpoint-2",
         "--resume_from_checkpoint '{tmp}/no/such/checkpoint-2': no such directory; give a "
         "checkpoint directory (checkpoint-N, as --save_steps writes them) or true (the last one "
         "in --output_dir)"),
        ("{tmp}/not_a_checkpoint",
         "--resume_from_checkpoint '{tmp}/not_a_checkpoint': not a checkpoint (no "
         "trainer_state.json); give a checkpoint directory"),
        ("true", "--resume_from_checkpoint true: no checkpoint-N directory in --output_dir "
         "'{tmp}/out'; give a checkpoint directory"),
    ],
)  # fmt: skip
def test_a_missing_checkpoint_is_one_line(tmp_path, capsys, value, match):
    (tmp_path / "not_a_checkpoint").mkdir()
    value, match = value.format(tmp=tmp_path), match.format(tmp=tmp_path)
    argv = ["train", "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", value]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gmpo train: error: ") and match in err[0], err
    assert not (tmp_path / "out").exists()  # refused before any work
