"""reasoning-gym's ``chain_sum`` for a chat model, wide enough that a run never sees its held-out
questions and rarely the same question twice: TERMS terms of MIN_DIGITS to MAX_DIGITS digits.

The user message is the gym's question and the answer format: "State the final answer to the
following arithmetic problem: 47 + 306 = Reply with the number only." The reward is
``chat_chain_sum``'s: the gym's ``score_answer`` of the reply's last number, read whole
(:data:`gmpo_tasks.chat.NUMBER`). The question space (:meth:`ChatArithTask.questions`) is over
100 times the questions a run and its held-out evaluation draw from the gym (its dataset's rows
and the held-out prompts), and the held-out split is disjoint from training by construction
(``gmpo_tasks.chat``). The configuration was chosen by the untrained model's held-out reward
on calibration seeds, then one training run (docs/real_model.md, results/real-model/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from gmpo_tasks.chat import NUMBER, ChatTask, RealCell

#: the calibrated configuration (docs/real_model.md): terms of a question, digits of each term
TERMS = 2
MIN_DIGITS = 1
MAX_DIGITS = 3


@dataclass(frozen=True)
class ChatArithTask(ChatTask):
    """The sum of ``length`` terms joined by ``+`` and ``-``, all of one number of digits drawn
    from ``min_digits`` to ``max_digits`` per question, asked in words."""

    length: int = TERMS
    min_digits: int = MIN_DIGITS
    max_digits: int = MAX_DIGITS

    name: ClassVar[str] = "chat_arith"
    about: ClassVar[str] = "a chat model: 'State the final answer ...: 47 + 306 =', 1.6M questions"
    gym_name: ClassVar[str] = "chain_sum"
    instruction: ClassVar[str] = "Reply with the number only."
    answer_pattern: ClassVar[re.Pattern[str]] = NUMBER
    format_pattern: ClassVar[re.Pattern[str]] = re.compile(NUMBER.pattern + r"\.?")
    #: chat_chain_sum's run at temperature 0.7: at 1 the untrained model rambles past 32 tokens
    settings: ClassVar[RealCell] = RealCell(temperature=0.7)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"digits must be 1 <= min <= max, got {self.min_digits}, "
                             f"{self.max_digits}")  # fmt: skip

    def config(self) -> dict[str, Any]:
        return {"min_terms": self.length, "max_terms": self.length,
                "min_digits": self.min_digits, "max_digits": self.max_digits}  # fmt: skip

    def questions(self) -> int:
        """The distinct questions the gym asks: per number of digits ``d``, ``values(d) ** terms``
        operands times ``2 ** (terms - 1)`` operators (one digit: 0 to 9; ``d`` digits: the
        ``9 * 10 ** (d - 1)`` numbers without a leading zero)."""

        def values(d: int) -> int:
            return 10 if d == 1 else 9 * 10 ** (d - 1)

        return sum(values(d) ** self.length * 2 ** (self.length - 1)
                   for d in range(self.min_digits, self.max_digits + 1))  # fmt: skip


TASK = ChatArithTask()
