"""gmpo_tasks.reverse: the reverse-digits task, its reward and its warm-start demonstrations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gmpo_tasks import chars, reverse
from gmpo_tasks.reverse import ReverseTask

ROOT = Path(__file__).resolve().parents[2]


def test_import_loads_neither_trl_nor_transformers_nor_torch() -> None:
    code = (
        "import json, sys; import gmpo_tasks.catalog; "
        "print(json.dumps(sorted(m for m in ('trl', 'transformers', 'torch') if m in sys.modules)))"
    )
    env_path = f"{ROOT}:{ROOT / 'adapters'}"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert json.loads(out.stdout) == []


def test_prompts_are_seeded_and_well_formed() -> None:
    task = ReverseTask(length=5)
    a, b = task.prompts(20, seed=3), task.prompts(20, seed=3)
    assert a == b
    assert a != task.prompts(20, seed=4)
    assert all(len(p) == 6 and p.endswith("=") and p[:-1].isdigit() for p in a)
    # another length draws other prompts, not a prefix of these
    assert [p[:3] for p in ReverseTask(length=2).prompts(20, seed=3)] != [p[:3] for p in a]


def test_exact_match_and_partial_credit() -> None:
    prompts = ["1234=", "1234=", "1234=", "1234=", "90="]
    completions = ["4321", "4321<eos>junk", "4311", "", "09"]
    assert reverse.reward(prompts, completions) == [1.0, 1.0, 0.0, 0.0, 1.0]
    # 4311 against 4321: positions 0, 1, 3 right -> 3/4; "" -> 0; "09" -> 1
    assert reverse.reward(prompts, completions, partial_credit=True) == [1.0, 1.0, 0.75, 0.0, 1.0]
    assert reverse.partial_reward(prompts[2:3], completions[2:3]) == [0.75]
    task = ReverseTask(length=4, partial_credit=True)
    assert task.reward(prompts[:3], completions[:3], trainer_state=None) == [1.0, 1.0, 0.75]
    assert task.reward_function() is reverse.partial_reward
    assert ReverseTask().reward_function() is reverse.reward
    with pytest.raises(ValueError):
        reverse.reward(["12="], ["21", "12"])  # lengths differ: zip(strict=True)


def test_demonstrations_are_seeded_and_noisy_at_the_stated_rate() -> None:
    task = ReverseTask(length=16, noise=0.1)
    demos = task.demonstrations(500, seed=0)
    assert demos == task.demonstrations(500, seed=0)
    assert demos != task.demonstrations(500, seed=1)
    wrong = sum(a != b for p, c in demos for a, b in zip(reverse.target(p), c, strict=True))
    # a digit is replaced w.p. 0.1 and the replacement is wrong w.p. 0.9: 9 % of 8000 digits =
    # 720, binomial std ~26: a band of about 4 std either side
    assert 620 < wrong < 820
    clean = ReverseTask(length=16, noise=0.0).demonstrations(50, seed=0)
    assert all(c == reverse.target(p) for p, c in clean)
    # a policy that matches the demonstrations: (0.9 + 0.01) ** 16
    assert task.expected_warm_reward() == pytest.approx(0.91**16)


def test_encode_decode_and_bad_settings() -> None:
    assert len(chars.VOCAB) == 16 and chars.VOCAB[:12] == "0123456789=+"
    assert chars.decode(chars.encode("0912=+abc")) == "0912=+abc"
    with pytest.raises(ValueError, match="vocabulary"):
        chars.encode("12x")
    with pytest.raises(ValueError, match="length"):
        ReverseTask(length=0)
    with pytest.raises(ValueError, match="noise"):
        ReverseTask(noise=1.5)
