"""studies/stability: the group advantages, determinism of the warm start and the runs, and the
schema of a ``--quick`` run's summary.json, the options' one-line refusals, and the run cache
(the rules: tests/stats/test_rules.py; the variants: tests/variants/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gmpo_variants import Variant
from gmpo_variants import registry as variant_registry
from gmpo_variants.gmpo import gmpo_variant
from studies.stability import __main__ as stability
from studies.stability import sweep as sweep_module
from studies.stability.files import read_json, write_atomic
from studies.stability.run import Setup, group_advantages, rl_run, warm_start
from studies.stability.sweep import read_curves
from tests._user_code import InlinePool, load_module, run_with_modules

ROOT = Path(__file__).resolve().parents[2]

RECORD_KEYS = {
    "variant": str, "lr": float, "seed": int, "grad_clip": (float, type(None)),
    "final_reward": float, "peak_reward": float, "collapsed": bool, "max_grad_norm": float,
    "log_ratio_min": float, "log_ratio_max": float, "entropy_end": float, "cpu_s": float,
}  # fmt: skip


def test_group_advantages() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), 4)
    # group 1: mean 0.25, unbiased std 0.5 -> (0.75 / 0.5001, -0.25 / 0.5001); group 2 all 0
    assert adv[:4].tolist() == pytest.approx([0.75 / 0.5001] + [-0.25 / 0.5001] * 3)
    assert adv[4:].tolist() == [0.0] * 4


TINY = Setup(length=2, warm_steps=40, warm_batch=32, prompts=2, group=4, minibatches=2, steps=3)


def test_warm_start_and_runs_are_deterministic() -> None:
    torch.set_num_threads(1)
    a, b = warm_start(TINY, 0), warm_start(TINY, 0)
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    assert a["reward"] == b["reward"]
    other = warm_start(TINY, 1)
    assert not torch.equal(a["state"]["tok.weight"], other["state"]["tok.weight"])
    run = rl_run(TINY, a, "gmpo", 5e-3, 1.0, 0)
    assert run == rl_run(TINY, a, "gmpo", 5e-3, 1.0, 0)
    assert len(run["reward"]) == 3 and all(np.isfinite(v) for v in run["grad_norm"])
    # some group has mixed rewards, so the policy moves off the sampling policy, and another
    # method moves it differently from the same start
    assert 0 < max(run["reward"]) and max(run["log_ratio_max"]) > 1e-3
    assert run["log_ratio_max"] != rl_run(TINY, a, "grpo", 5e-3, 1.0, 0)["log_ratio_max"]


def test_quick_run_writes_the_summary_schema(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'adapters'}"}
    cmd = [sys.executable, "-m", "studies.stability", "--quick", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300, cwd=ROOT)
    records = json.loads((tmp_path / "summary.json").read_text())
    assert {(r["variant"], r["seed"]) for r in records} == {
        (m, s) for m in ("grpo", "gmpo") for s in (0, 1)
    }
    for r in records:
        for key, kind in RECORD_KEYS.items():
            assert isinstance(r[key], kind), (key, r[key])
        assert r["log_ratio_min"] <= 0 <= r["log_ratio_max"] and r["cpu_s"] > 0
        assert r["peak_reward"] >= r["final_reward"]
        assert r["collapsed"] == (r["peak_reward"] - r["final_reward"] >= 0.3 - 1e-12)
    md = (tmp_path / "summary.md").read_text()
    for heading in ("## Collapsed runs", "## Sign tests", "one-sided p", "## Cost"):
        assert heading in md
    assert (tmp_path / "stability.png").stat().st_size > 10_000
    assert len(read_curves(tmp_path)) == 4
    # a subset reruns from the cache: the same numbers, nothing recomputed
    sub = subprocess.run([*cmd, "--methods", "gmpo", "--seeds", "1"], check=True, env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again == [r for r in records if (r["variant"], r["seed"]) == ("gmpo", 1)]
    assert "0 s CPU computed" in sub.stdout


# Regression (CHANGELOG, 0.2): duplicates were run once and counted many times, option
# errors were tracebacks (or argparse's usage block), and --steps 0 failed after the warm start.
REFUSED = {  # id: (arguments, the option the refusal names)
    "duplicates": (["--seeds", "0,0", "--methods", "gmpo,gmpo"], "--variants"),
    "duplicate seed": (["--seeds", "1,0,1"], "--seeds"),
    "duplicate variant": (["--methods", "gmpo,grpo,gmpo"], "--variants"),
    "duplicate lr": (["--lr", "5e-3,0.005"], "--lr"),
    "duplicate clip": (["--grad-clip", "none,None"], "--grad-clip"),
    "steps 0": (["--steps", "0"], "--steps"),
    "steps abc": (["--steps", "abc"], "--steps"),
    "clip 0": (["--grad-clip", "0"], "--grad-clip"),
    "clip -1": (["--grad-clip", "-1"], "--grad-clip"),
    "clip nan": (["--grad-clip", "nan"], "--grad-clip"),
    "workers 0": (["--workers", "0"], "--workers"),
    "lr abc": (["--lr", "abc"], "--lr"),
    "lr 0": (["--lr", "0"], "--lr"),
    "lr empty item": (["--lr", "5e-3,"], "--lr"),
    "seeds abc": (["--seeds", "0,x"], "--seeds"),
    "setup unknown key": (["--setup", "nope=1"], "--setup"),
    "setup task_name": (["--setup", "task_name=add"], "--setup"),
    "setup bad bool": (["--setup", "tied=maybe"], "--setup"),
    "setup bad number": (["--setup", "beta2=x"], "--setup"),
    "setup beta2 1": (["--setup", "beta2=1"], "--setup"),
    "setup noise 2": (["--setup", "noise=2"], "--setup"),
    "variant no module": (["--methods", "no_such_module_x:f"], "--variants"),
    "variant no function": (["--methods", "gmpo_variants.gmpo:nope"], "--variants"),
    "variant unknown": (["--variants", "gmpo_wider"], "--variants"),
    # (CHANGELOG, Unreleased): values no run can use, refused before any warm start
    "setup heads 0": (["--setup", "heads=0"], "--setup"),
    "setup minibatches 0": (["--setup", "minibatches=0"], "--setup"),
    "setup prompts 0": (["--setup", "prompts=0"], "--setup"),
    "setup d 30, 4 heads": (["--setup", "d=30"], "--setup"),
    "setup group 1": (["--setup", "group=1"], "--setup"),
    "setup minibatches > batch": (["--setup", "minibatches=999"], "--setup"),
    "setup warm_steps -1": (["--setup", "warm_steps=-1"], "--setup"),
    "setup length 0": (["--setup", "length=0"], "--setup"),
    "cells no lr": (["--cells", "gmpo"], "--cells"),
    "cells bad lr": (["--cells", "gmpo=0"], "--cells"),
    "cells twice": (["--cells", "gmpo=1e-3,gmpo=1e-3"], "--cells"),
    "cells with lr": (["--cells", "gmpo=1e-3", "--lr", "1e-3"], "--cells"),
    "cells unknown variant": (["--cells", "gmpo_wider=1e-3"], "--variants"),
}  # fmt: skip


@pytest.mark.parametrize(("argv", "option"), REFUSED.values(), ids=REFUSED.keys())
def test_cli_refusals_are_one_line_exit_2_before_the_warm_start(
    argv: list[str], option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    def ran(*args: Any) -> None:
        raise AssertionError(f"{argv} reached the sweep")

    monkeypatch.setattr(stability, "sweep", ran)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        stability.main([*argv, "--quick", "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("python -m studies.stability: error: ") and option in err, err
    assert not out.exists()


@pytest.fixture
def fake_sweep(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """stability.sweep without workers and with stand-in jobs: a run's reward curve is its
    learning rate; returns the (method, lr) of every run computed."""
    computed: list[tuple[str, float]] = []

    def warm_job(setup: dict, seed: int, path: str) -> dict:
        Path(path).write_bytes(b"")
        return {"reward": 0.5, "entropy": 1.0, "cpu_s": 0.0}

    def run_job(setup: dict, variant: str, lr: float, clip: Any, seed: int, warm: str) -> dict:
        computed.append((variant, lr))
        return {"curves": {"reward": [lr]}, "cpu_s": 0.0}

    monkeypatch.setattr(sweep_module, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(sweep_module, "warm_job", warm_job)
    monkeypatch.setattr(sweep_module, "run_job", run_job)
    return computed


LR2 = 1.000000001e-3  # equal to 1e-3 in 6 significant digits


# Regression (CHANGELOG, 0.2): run files were named with :g, so learning rates that
# differ past 6 significant digits shared one (the second run overwrote the first).
def test_learning_rates_that_differ_past_6_digits_are_two_runs(
    tmp_path: Path, fake_sweep: list[tuple[str, float]]
) -> None:
    args = stability.parse(["--methods", "gmpo", "--lr", f"1e-3,{LR2!r}", "--grad-clip", "none",
                            "--seeds", "0", "--out", str(tmp_path)])  # fmt: skip
    runs, _, _ = stability.sweep(args, Setup(steps=1))
    assert [res["curves"]["reward"] for _, res in runs] == [[1e-3], [LR2]]
    assert sorted(fake_sweep) == [("gmpo", 1e-3), ("gmpo", LR2)]


def test_cells_run_each_variant_at_its_own_rates_only(
    tmp_path: Path, fake_sweep: list[tuple[str, float]]
) -> None:
    """--cells runs the pairs it names, not the product of their variants and rates; a later
    invocation with more pairs reuses the runs it shares and its summary holds them all."""
    argv = ["--grad-clip", "none", "--seeds", "0,1", "--out", str(tmp_path)]
    args = stability.parse(["--cells", "gmpo=2e-3,grpo=1e-3", *argv])
    assert (args.variants, args.lr) == (["gmpo", "grpo"], [2e-3, 1e-3])
    runs, _, _ = stability.sweep(args, Setup(steps=1))
    assert [(j[0], j[1], j[3]) for j, _ in runs] == [
        ("gmpo", 2e-3, 0), ("gmpo", 2e-3, 1), ("grpo", 1e-3, 0), ("grpo", 1e-3, 1)]  # fmt: skip
    fake_sweep.clear()
    more = stability.parse(["--cells", "gmpo=2e-3,grpo=1e-3,grpo=2e-3", *argv])
    runs, _, _ = stability.sweep(more, Setup(steps=1))
    assert sorted(fake_sweep) == [("grpo", 2e-3), ("grpo", 2e-3)]  # the new pair only
    assert len(runs) == 6


# Regression (CHANGELOG, 0.2): the run cache was keyed by the method's name, so a rerun
# after a change to a method returned the old method's runs.
def test_a_method_changed_under_its_name_is_recomputed(
    tmp_path: Path, fake_sweep: list[tuple[str, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = stability.parse(["--methods", "grpo,gmpo", "--lr", "1e-3", "--grad-clip", "none",
                            "--seeds", "0", "--out", str(tmp_path)])  # fmt: skip
    stability.sweep(args, Setup(steps=1))
    assert sorted(fake_sweep) == [("gmpo", 1e-3), ("grpo", 1e-3)]
    fake_sweep.clear()
    stability.sweep(args, Setup(steps=1))
    assert fake_sweep == []  # unchanged: every run from the cache
    narrow = Variant("gmpo", "GMPO, +-0.3",
                     lambda lp, old, a, m: gmpo_variant(lp, old, a, m, epsilon=0.3))  # fmt: skip
    monkeypatch.setitem(variant_registry._REGISTRY, "gmpo", narrow)
    stability.sweep(args, Setup(steps=1))
    assert fake_sweep == [("gmpo", 1e-3)]  # the changed variant only


# Regression: one run file cut short (a kill or a full disk during its write) made every later
# rerun die in a JSONDecodeError traceback, until the file was deleted by hand.
def test_a_file_cut_short_is_named_and_computed_again(
    tmp_path: Path, fake_sweep: list[tuple[str, float]], capsys: Any
) -> None:
    args = stability.parse(["--methods", "grpo,gmpo", "--lr", "1e-3", "--grad-clip", "none",
                            "--seeds", "0,1", "--out", str(tmp_path)])  # fmt: skip
    first, _, _ = stability.sweep(args, Setup(steps=1))
    [cut] = (tmp_path / "runs").glob("gmpo_*_seed1_*.json")
    cut.write_bytes(cut.read_bytes()[:30])
    [meta] = (tmp_path / "warm").glob("*_seed0.json")
    meta.write_text('{"rew')
    log = tmp_path / "invocations.jsonl"
    log.write_text(log.read_text() + '{"started": "2')
    fake_sweep.clear()
    capsys.readouterr()
    again, warm, _ = stability.sweep(args, Setup(steps=1))
    assert fake_sweep == [("gmpo", 1e-3)] and again == first  # that run alone, computed again
    assert json.loads(meta.read_text()) == warm[0]  # the warm start too
    out = capsys.readouterr().out
    for line in (f"{cut}: cannot be read (JSONDecodeError): computing it again",
                 f"{meta}: cannot be read (JSONDecodeError): computing it again",
                 f"{log}: line 2 cannot be read: left out of the cost table"):  # fmt: skip
        assert line in out.splitlines(), out
    assert [json.loads(x)["runs"] for x in log.read_text().splitlines()] == [4, 1]
    assert sorted(p.name for p in tmp_path.rglob(".*")) == []  # no temporary file left


def test_a_write_cut_short_leaves_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.json"
    write_atomic(path, '{"old": 1}\n')

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, '{"new": 2}\n' * 1000)
    assert read_json(path) == {"old": 1} and [p.name for p in tmp_path.iterdir()] == ["run.json"]


_COUNTED = (
    "import os\n\ndef fn(lp, old, a, m):\n"
    "    with open(os.environ['STUDY_CALLS'], 'ab') as f:\n        f.write(b'.')\n"
    "    return -((lp - old).exp() * a[:, None] * m).sum() / m.sum()\n"
)
_TINY = "warm_steps=0,prompts=2,group=2,minibatches=1,d=8,heads=1,layers=1"


# Regression: Ctrl-C did not stop the study. Leaving the ProcessPoolExecutor block waited for
# every queued run: after SIGINT a quick study ran 55 s more, and kept nothing it computed.
def test_ctrl_c_stops_within_a_run_and_keeps_what_finished(tmp_path: Path) -> None:
    out, calls = tmp_path / "out", tmp_path / "calls"
    calls.touch()
    (tmp_path / "counted_variant_mod.py").write_text(_COUNTED)
    rates = ",".join(f"{k}e-4" for k in range(1, 31))
    argv = ["-m", "studies.stability", "--quick", "--methods", "counted_variant_mod:fn", "--lr",
            rates, "--seeds", "0", "--steps", "3", "--workers", "1", "--setup", _TINY,
            "--out", str(out)]  # fmt: skip
    updates = 3 * Setup().epochs  # loss calls a run: steps x epochs x minibatches
    path = os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "adapters")])
    env = {**os.environ, "PYTHONPATH": path, "STUDY_CALLS": str(calls)}
    proc = subprocess.Popen([sys.executable, *argv], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((out / "runs").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.02)
    at_signal = calls.stat().st_size
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    kept = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == (
        f"python -m studies.stability: interrupted: {len(kept)} of 30 runs computed and kept in "
        f"{out}/runs; the same command computes the rest"
    )
    # every run computed is kept; after the signal, the rest of the run under way (and one
    # more, had one started as the signal was sent), not the queue
    assert 1 <= len(kept) < 30 and calls.stat().st_size == len(kept) * updates
    assert calls.stat().st_size - at_signal <= 2 * updates


# Regression (CHANGELOG, Unreleased): a variant module that raises at import or does not parse
# ended the study in a traceback of 26-29 lines.
@pytest.mark.parametrize(
    ("source", "message"),
    [("raise RuntimeError('boom')\n", "RuntimeError: boom"), ("def fn(:\n", "SyntaxError")],
    ids=["raises", "syntax"],
)
def test_a_variant_module_that_fails_to_import_is_one_line(
    source: str, message: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = ["-m", "studies.stability", "--methods", "broken_variant_mod:fn", "--quick", "--out",
            str(out)]  # fmt: skip
    proc = run_with_modules(argv, tmp_path, {"broken_variant_mod": source})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("python -m studies.stability: error: --variants: variant ")
    assert message in proc.stderr and not out.exists()


_HELPERS = "def loss(lp, old, a, m):\n    return ((lp - old) * a[:, None]).sum() * {}\n"
_VARIANT = "import study_helpers_mod as helpers\n\ndef fn(lp, old, a, m):\n    return helpers.loss(lp, old, a, m)\n"
_CALLABLE = (
    "class Loss:\n    def __call__(self, lp, old, a, m):\n        return (lp - old).sum() * {}\n\n"
    "fn = Loss()\n"
)


# Regression (CHANGELOG, Unreleased): a variant that calls a helper through a module attribute, or a
# callable object whose __call__ changed, kept its fingerprint, and the cache reused stale runs.
@pytest.mark.parametrize("kind", ["module attribute", "callable object"])
def test_a_change_behind_a_module_attribute_or_a_call_is_recomputed(
    kind: str, tmp_path: Path, fake_sweep: list[tuple[str, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "study_variant_mod"

    def define(factor: str) -> None:
        if kind == "module attribute":
            load_module(monkeypatch, tmp_path, "study_helpers_mod", _HELPERS.format(factor))
            load_module(monkeypatch, tmp_path, name, _VARIANT)
        else:
            load_module(monkeypatch, tmp_path, name, _CALLABLE.format(factor))

    define("1.0")
    args = stability.parse([f"--methods={name}:fn", "--lr", "1e-3", "--grad-clip", "none",
                            "--seeds", "0", "--out", str(tmp_path / "out")])  # fmt: skip
    stability.sweep(args, Setup(steps=1))
    assert fake_sweep == [(f"{name}:fn", 1e-3)]
    fake_sweep.clear()
    define("1.0")
    stability.sweep(args, Setup(steps=1))
    assert fake_sweep == []  # the same definition: from the cache
    define("2.0")
    stability.sweep(args, Setup(steps=1))
    assert fake_sweep == [(f"{name}:fn", 1e-3)]  # the changed helper or __call__: recomputed
