"""reasoning-gym's ``countdown``: reach a target with every given number, where many answers are
right.

The gym's entry (``create_dataset("countdown", min_numbers=L, max_numbers=L, min_value=1,
max_value=9, min_target=1, max_target=9L, operators=("+", "-"))``) asks "Calculate 12 using all
of these numbers: 3, 9, 6. ..."; the compact prompt is its metadata's numbers, ``:`` and the
target with two digits, then ``=``: ``"396:12="``. The demonstrations' answer is the gym's own
expression without spaces, ``"9-3+6"`` (``2L - 1`` characters); any order and signs of the
numbers that reach the target are right as well (``"6+9-3"``). The reward is the gym's
``score_answer``: 1.0 for an expression that uses exactly the given numbers and equals the
target, 0.05 for another expression of numbers, 0.01 for what does not parse.

Only ``+`` and ``-``: with ``*`` in the alphabet, a sampled completion such as ``9**9**9`` is a
power tower that the gym's parser (sympy) evaluates exactly, without end. Settings: the
calibration rule of ``studies.stability.calibrate`` on the calibration seeds only
(results/tasks-gym/calibration_countdown.md), which keeps every seed's warm start in a band
away from zero reward.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gmpo_tasks.chars import DIGITS, SEP
from gmpo_tasks.gym import GymTask
from gmpo_tasks.warm_start import WarmStart

#: the calibrated setting (results/tasks-gym/calibration_countdown.md): 3 numbers, 800 supervised
#: steps (the first count at which a clean warm start reached 0.5 on every calibration seed) and
#: noise 0.1 (the smallest that put every seed in [0.15, 0.45]: 0.182, 0.346, 0.294)
LENGTH = 3
NOISE = 0.1
WARM = WarmStart(steps=800)
COLON = ":"


@dataclass(frozen=True)
class CountdownTask(GymTask):
    """``length`` one-digit numbers, each used once with ``+`` or ``-``, to reach a target."""

    length: int = LENGTH
    noise: float = NOISE
    warm: WarmStart = field(default=WARM)

    name: ClassVar[str] = "countdown"
    about: ClassVar[str] = "3 one-digit numbers with + and -, prompt '396:12=', many right answers"
    alphabet: ClassVar[str] = DIGITS + "+-" + COLON + SEP
    symbols: ClassVar[str] = DIGITS + "+-" + COLON + SEP
    answer_chars: ClassVar[str] = DIGITS + "+-"
    quick_length: ClassVar[int] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.length < 2:
            raise ValueError(
                f"length must be at least 2 (the gym's min_numbers), got {self.length}"
            )

    @property
    def target_digits(self) -> int:
        return len(str(9 * self.length))

    @property
    def prompt_length(self) -> int:
        """The ``L`` numbers, ``:``, the target and ``=``."""
        return self.length + self.target_digits + 2

    @property
    def answer_length(self) -> int:
        """``L`` numbers and ``L - 1`` signs."""
        return 2 * self.length - 1

    def config(self) -> dict[str, Any]:
        return {"min_numbers": self.length, "max_numbers": self.length, "min_value": 1,
                "max_value": 9, "min_target": 1, "max_target": 9 * self.length,
                "operators": ("+", "-")}  # fmt: skip

    def compact(self, entry: dict[str, Any]) -> str:
        meta = entry["metadata"]
        target = str(meta["target"]).zfill(self.target_digits)
        return "".join(map(str, meta["numbers"])) + COLON + target + SEP

    def rebuild(self, prompt: str) -> dict[str, Any]:
        """The numbers and the target (all that the gym's score_answer reads), and a right
        answer: the first of the prompt's order and signs that reaches the target."""
        numbers, target = prompt.removesuffix(SEP).split(COLON)
        values, goal = [int(d) for d in numbers], int(target)
        answer = None
        for order in itertools.permutations(values):
            for signs in itertools.product((1, -1), repeat=len(values) - 1):
                if order[0] + sum(s * v for s, v in zip(signs, order[1:], strict=True)) == goal:
                    answer = str(order[0]) + "".join(
                        ("+" if s > 0 else "-") + str(v)
                        for s, v in zip(signs, order[1:], strict=True)
                    )
                    break
            if answer is not None:
                break
        return {"answer": answer, "metadata": {"numbers": values, "target": goal}}

    def answer(self, entry: dict[str, Any]) -> str:
        return str(entry["answer"]).replace(" ", "")


TASK = CountdownTask()
