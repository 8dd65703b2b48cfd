"""reasoning-gym's ``chain_sum``: a chain of one-digit additions and subtractions, answers of
varying length.

The gym's entry (``create_dataset("chain_sum", min_terms=L, max_terms=L, min_digits=1,
max_digits=1)``) asks "State the final answer to the following arithmetic problem: 4 - 1 - 7 =";
the compact prompt is its metadata's expression without spaces and ``=``: ``"4-1-7="``, ``2L``
characters. The answer is the gym's, ``"-4"``: at ``L = 3`` terms from ``-18`` to ``27``, one
to three characters, then the end-of-sequence token. The reward is the gym's
``score_answer`` (1.0 for the number, however written: ``"+04"`` is ``4``; a completion that
contains the answer gets ``len(answer) / len(completion)``; else 0).

Its settings come from the calibration rule of ``studies.stability.calibrate`` on the
calibration seeds only (results/tasks-gym/calibration_chain_sum.md): the smallest warm start
and noise whose warm-start reward lies in the band on every calibration seed, so that no seed
starts near zero reward, where a group of all-zero rewards has no gradient.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gmpo_tasks.chars import DIGITS, SEP
from gmpo_tasks.gym import GymTask
from gmpo_tasks.warm_start import WarmStart

#: the calibrated setting (results/tasks-gym/calibration_chain_sum.md): 3 terms, 800 supervised
#: steps (the first count at which a clean warm start reached 0.5 on every calibration seed) and
#: noise 0.1 (the smallest that put every seed in [0.15, 0.45]: 0.336, 0.318, 0.403)
LENGTH = 3
NOISE = 0.1
WARM = WarmStart(steps=800)
_TERM = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class ChainSumTask(GymTask):
    """The sum of ``length`` one-digit terms joined by ``+`` and ``-``."""

    length: int = LENGTH
    noise: float = NOISE
    warm: WarmStart = field(default=WARM)

    name: ClassVar[str] = "chain_sum"
    about: ClassVar[str] = "3 one-digit terms, prompt '4-1-7=', answers of 1 to 3 characters"
    alphabet: ClassVar[str] = DIGITS + "+-" + SEP
    symbols: ClassVar[str] = DIGITS + "+-" + SEP
    answer_chars: ClassVar[str] = DIGITS + "-"
    variable_length: ClassVar[bool] = True
    quick_length: ClassVar[int] = 2

    @property
    def prompt_length(self) -> int:
        """The ``L`` digits, the ``L - 1`` signs and ``=``."""
        return 2 * self.length

    @property
    def answer_length(self) -> int:
        """The longest answer: ``9L`` or ``-9(L - 1)``."""
        return max(len(str(9 * self.length)), len(str(-9 * (self.length - 1))))

    def config(self) -> dict[str, Any]:
        return {"min_terms": self.length, "max_terms": self.length, "min_digits": 1,
                "max_digits": 1}  # fmt: skip

    def compact(self, entry: dict[str, Any]) -> str:
        return entry["metadata"]["expression"].replace(" ", "") + SEP

    def rebuild(self, prompt: str) -> dict[str, Any]:
        """The expression's value is the gym's answer (all that its score_answer reads)."""
        expression = prompt.removesuffix(SEP)
        terms = _TERM.findall(expression)
        return {"answer": str(sum(int(t) for t in terms)),
                "metadata": {"expression": " ".join(re.split(r"(?<=\d)([+-])", expression)),
                             "num_terms": len(terms), "num_digits": 1}}  # fmt: skip

    def answer(self, entry: dict[str, Any]) -> str:
        return str(entry["answer"])


TASK = ChainSumTask()
