"""studies/stability/band.py: the band rule's choices (with stand-in warm starts), its report,
and ``calibrate --task`` refusing a gym task without reasoning_gym."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from studies.stability import band, calibrate
from tests._user_code import InlinePool


def _rule(monkeypatch: pytest.MonkeyPatch, reward: Any) -> tuple[dict[str, Any], list[tuple]]:
    """calibrate_band on chain_sum with warm starts whose reward is ``reward(steps, noise,
    seed)``; the result and every warm start asked for."""
    asked: list[tuple] = []

    def warm(task: str, steps: int, noise: float, seed: int) -> dict[str, Any]:
        asked.append((steps, noise, seed))
        return {"steps": steps, "noise": noise, "seed": seed, "reward": reward(steps, noise, seed),
                "entropy": 1.0, "cpu_s": 1.0, "warm": {}}  # fmt: skip

    def run(task: str, steps: int, noise: float, seed: int, w: dict) -> dict[str, Any]:
        return {"seed": seed, "warm_reward": 0.3, "warm_cpu_s": 1.0, "first10": 0.3,
                "last10": 0.6, "length_first": 2.5, "length_last": 2.1, "run_cpu_s": 12.0,
                **({"hf_reward": 0.25, "hf_cpu_s": 30.0} if seed == 900 else {})}  # fmt: skip

    monkeypatch.setattr(band, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(band, "_warm", warm)
    monkeypatch.setattr(band, "_run", run)
    monkeypatch.setattr(band, "_examples", lambda task: [{"prompt": "4-1-7=", "answer": "-4"}])
    return band.calibrate_band("chain_sum", 1), asked


def test_the_first_clean_step_count_then_the_smallest_noise_in_the_band(monkeypatch) -> None:
    # clean reward 0.5, 0.75, 0.9 at 400, 800, 1600 (seed 902 0.05 lower); noise x takes
    # 1.2 x off it
    def reward(steps: int, noise: float, seed: int) -> float:
        clean = {400: 0.5, 800: 0.75, 1600: 0.9}[steps] - (0.05 if seed == 902 else 0.0)
        return max(clean - 1.2 * noise, 0.0)

    result, asked = _rule(monkeypatch, reward)
    # 800: the first count at which every seed reaches 0.5; at 800, noise 0.25 puts every seed
    # at most 0.45 (0.45, 0.45, 0.40); 0.20 leaves two above it
    assert (result["steps"], result["noise"]) == (800, 0.25)
    assert {(s, n) for s, n, _ in asked} >= {(400, 0.0), (800, 0.0), (800, 0.25), (800, 0.2)}
    assert (1600, 0.0) not in {(s, n) for s, n, _ in asked}  # no count past the first
    assert all("warm" not in r for r in result["rows"])
    md = band.report_band(result, "python -m studies.stability.calibrate --task chain_sum", 9.0)
    assert "Chosen: 800 supervised steps, noise 0.25." in md
    assert "| 900 | 0.300 | 0.300 | 0.600 | 2.50, 2.10 | 1.0 | 12.0 | 0.250 | 30.0 |" in md
    assert "| 901 | 0.300 | 0.300 | 0.600 | 2.50, 2.10 | 1.0 | 12.0 | - | - |" in md
    assert "| `4-1-7=` | `-4` |" in md


def test_seeds_wider_than_the_band_choose_nothing(monkeypatch) -> None:
    # seed 902 stays 0.35 below the others: when they reach 0.45 it is below 0.15
    def reward(steps: int, noise: float, seed: int) -> float:
        return max(0.9 - noise - (0.35 if seed == 902 else 0.0), 0.0)

    result, _ = _rule(monkeypatch, reward)
    assert (result["steps"], result["noise"], result["runs"]) == (None, None, [])
    md = band.report_band(result, "cmd", 1.0)
    assert "No step count and noise put every seed in the band." in md


def test_calibrate_refuses_a_gym_task_without_reasoning_gym(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    monkeypatch.setattr(calibrate, "calibrate_band", lambda *a: pytest.fail("calibrated"))
    with pytest.raises(SystemExit) as exc:
        calibrate.main(["--task", "countdown", "--out", "unused"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "pip install -e '.[gym]'" in err
