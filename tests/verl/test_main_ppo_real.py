"""verl's trainer on the real model: ``python -m verl.trainer.main_ppo`` with ``loss_mode=gmpo``
fine-tunes SmolLM2-135M-Instruct (``gmpo_tasks.pretrained``, no hub) for two steps on CPU.

The same CPU support and helpers as ``test_main_ppo.py`` (``verl_cpu/e2e.py``), with
``prepare(workdir, model)``: the model directory used in place with its own tokenizer and chat
template, ``chat_chain_sum``'s questions as verl's chat-message ``prompt`` column, that task's
reward (reasoning-gym's ``score_answer`` of the reply's last integer, with a closeness term for a
wrong integer) as a reward function file, and :data:`verl_cpu.e2e.REAL`'s sizes: 2 prompts x 4 samples of at most 16 tokens a step,
updated in 2 mini-batches of one prompt (the second update is off-policy), on the legacy
trainer (``trainer.use_v1=False``; the faster of the two on CPU, see test_main_ppo.py).

The fast tests check the files ``prepare`` writes for a real model (the rows, the reward file)
without loading it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")
pytest.importorskip("reasoning_gym")

from tests.verl import _versions
from verl_cpu import e2e as _e2e

if (_missing := _versions.no_cpu_platform() or _versions.no_v1_trainer()) is not None:
    pytest.skip(_missing, allow_module_level=True)

pytestmark = [pytest.mark.verl]

TIMEOUT = 900
STEPS = 2
GMPO_METRICS = (*_e2e.GMPO_METRICS, "actor/pg_loss", "actor/grad_norm")
# max |p_rollout - p_actor| over a step's tokens: the rollout (one unpadded sequence) and the
# actor (a left-padded batch) compute in float32 with the same weights: 2.9e-5 on both steps
# (measured). One update at lr 2e-5 moved the second mini-batch's log-probs by up to 0.43
# (actor/log_ratio_min, measured): a rollout that kept its first weights would be far beyond this
SYNCED_PROBS_DIFF = 1e-3
_SYNC = re.compile(r"hf rollout: weights synced \(sync (\d+), global_steps (\d+)")


def _load_reward(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("real_reward", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def _fake_model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_prepare_writes_chat_rows_and_the_tasks_reward(tmp_path: Path) -> None:
    import pandas as pd

    model = _fake_model(tmp_path)
    files = _e2e.prepare(tmp_path, model)
    assert files["model"] == files["tokenizer"] == model.resolve()  # used in place
    rows = pd.read_parquet(files["data"]).to_dict("records")
    assert len(rows) == 16
    score = _load_reward(files["reward"])
    for row in rows:
        (message,) = row["prompt"]  # verl's chat format: a list of messages
        assert message["role"] == "user"
        assert message["content"].startswith("State the final answer")
        assert message["content"].endswith("Reply with the number only.")
        answer = row["reward_model"]["ground_truth"]
        extra = dict(row["extra_info"])  # verl passes extra_info to the reward as it is stored
        assert json.loads(extra["entry"])["answer"] == answer
        assert score(row["data_source"], f"It is {answer}", answer, extra) == 1.0
        assert score(row["data_source"], "I do not know.", answer, extra) == 0.0
        wrong = str(int(answer) + 2)  # the last integer counts; a wrong one by its distance
        if answer not in wrong:  # (a number that contains the answer earns the gym's credit)
            assert score(row["data_source"], f"{answer} or {wrong}", answer, extra) == 0.5 / 3
    entry = {"question": "1 + 2 =", "answer": "3", "metadata": {}}
    reply = "The answer is -31."  # the gym's partial credit: len("3") / len("-31")
    assert score("x", reply, "3", {"entry": json.dumps(entry)}) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="is not"):
        score(rows[0]["data_source"], "1", "no such answer", dict(rows[0]["extra_info"]))


def test_prepare_refuses_a_folder_that_is_no_model(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        _e2e.prepare(tmp_path, tmp_path / "nowhere")


def test_real_overrides_compose_into_a_gmpo_config(tmp_path: Path) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    files = _e2e.prepare(tmp_path, _fake_model(tmp_path))
    args = _e2e.overrides(files, tmp_path, v1=False, steps=STEPS, sizes=_e2e.REAL)
    config = _e2e.compose_config(args)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "gmpo"
    assert actor.optim.lr == _e2e.REAL.lr
    assert (actor.ppo_mini_batch_size, actor.ppo_epochs) == (1, 1)
    assert config.data.train_batch_size == 2 and config.actor_rollout_ref.rollout.n == 4
    assert config.data.max_response_length == 16
    assert config.actor_rollout_ref.model.tokenizer_path == str(files["model"])
    assert config.trainer.total_training_steps == STEPS and config.trainer.use_v1 is False
    # the mini-batches after the first are off-policy: at least two a step
    assert _e2e.REAL.batch // _e2e.REAL.mini_batch * _e2e.REAL.epochs >= 2


def test_the_command_line_prepares_a_real_model(tmp_path: Path) -> None:
    """``python -m verl_cpu.e2e prepare DIR MODEL`` and ``smoke-overrides STEPS real``: what
    ``examples/verl/smoke_test_cpu.sh`` would pass for the real model."""

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "verl_cpu.e2e", *args], capture_output=True, text=True,
            timeout=300, cwd=_e2e.REPO, env=os.environ | {"PYTHONPATH": str(_e2e.REPO)},
        )  # fmt: skip

    model = _fake_model(tmp_path)
    prepared = cli("prepare", str(tmp_path / "work"), str(model))
    assert prepared.returncode == 0, prepared.stderr
    lines = prepared.stdout.split()
    assert f"actor_rollout_ref.model.path={model.resolve()}" in lines
    assert f"data.max_response_length={_e2e.REAL.response_length}" in lines
    assert (tmp_path / "work" / "train.parquet").is_file()
    smoke = cli("smoke-overrides", "2", "real").stdout.split()
    assert smoke == _e2e.smoke_overrides(2, _e2e.REAL)
    assert "data.train_batch_size=2" in smoke and "trainer.total_training_steps=2" in smoke
    assert cli("smoke-overrides", "2", "huge").returncode == 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, float]:
    from gmpo_tasks import pretrained

    workdir = tmp_path_factory.mktemp("real")
    files = _e2e.prepare(workdir, pretrained.resolve("smollm2-135m"))
    args = _e2e.overrides(files, workdir, v1=False, steps=STEPS, sizes=_e2e.REAL)
    start = time.monotonic()
    returncode, log = _e2e.run(workdir, args, timeout=TIMEOUT)
    (workdir / "log.txt").write_text(log)
    return returncode, log, time.monotonic() - start


def _tail(log: str) -> str:
    return _e2e.plain(log)[-8000:]


@pytest.mark.slow
def test_two_steps_on_the_real_model_with_finite_gmpo_metrics(run: tuple[int, str, float]) -> None:
    returncode, log, seconds = run
    assert returncode == 0, _tail(log)
    print(f"real model: {STEPS} steps in {seconds:.0f} s")
    for line in _e2e.step_lines(log):
        print(line[:600])
    steps = _e2e.step_metrics(log)
    assert sorted(steps) == list(range(1, STEPS + 1)), _tail(log)
    for step, metrics in steps.items():
        for key in (*GMPO_METRICS, "critic/score/mean"):
            assert key in metrics, (step, key, sorted(metrics))
            assert math.isfinite(metrics[key]), (step, key, metrics[key])
        assert metrics["actor/log_ratio_min"] <= 0 <= metrics["actor/log_ratio_max"], step
        for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/score/mean"):
            assert 0 <= metrics[key] <= 1, (step, key, metrics[key])
        # the real model was prompted: a 16-token budget, and replies that end before it
        assert 0 < metrics["response_length/mean"] <= _e2e.REAL.response_length, step
    # from the first step on, the rewards of a group differ (advantages), GMPO's loss has a
    # gradient, and the second mini-batch sees the weights the first one moved: the policy
    # drifted from the rollout's by far more than the rollout-vs-actor check below tolerates
    for step, metrics in steps.items():
        assert metrics["critic/advantages/max"] > 0, (step, "no advantage: the rewards tied")
        assert metrics["actor/grad_norm"] > 0, step
        assert metrics["actor/ppo_kl"] != 0, step
        drift = max(-metrics["actor/log_ratio_min"], metrics["actor/log_ratio_max"])
        assert drift > 10 * SYNCED_PROBS_DIFF, (step, drift)


@pytest.mark.slow
def test_the_real_models_rollout_samples_with_the_updated_weights(
    run: tuple[int, str, float],
) -> None:
    returncode, log, _ = run
    assert returncode == 0, _tail(log)
    syncs = [(int(n), int(step)) for n, step in _SYNC.findall(_e2e.plain(log))]
    # one sync before each step's generation; step 2 samples after step 1's update
    assert [step for _, step in syncs][:STEPS] == list(range(STEPS)), syncs
    for step, metrics in _e2e.step_metrics(log).items():
        assert metrics["training/rollout_probs_diff_max"] < SYNCED_PROBS_DIFF, (step, metrics)
