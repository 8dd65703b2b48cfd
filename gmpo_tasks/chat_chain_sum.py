"""reasoning-gym's ``chain_sum`` for a chat model: two one-digit terms, the gym's question as a
user message, the answer the last number of the reply.

The user message is the gym's question and the answer format: "State the final answer to the
following arithmetic problem: 4 - 7 = Reply with the number only." The reward is the gym's
``score_answer`` of the reply's last number, read whole (:data:`gmpo_tasks.chat.NUMBER`: sign,
thousands separators and decimal part; 1.0 for the number however written, ``"+04"``, ``"12.0"``,
``"1,000"``; a number that contains the answer, ``"-31"`` for ``"-3"`` or ``"2.5"`` for ``"5"``,
``len(answer) / len(number)``; else 0). Untrained, SmolLM2-135M-Instruct scores 0.18 on average
at temperature 1 (results/real-model/calibration.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from gmpo_tasks.chat import NUMBER, ChatTask

#: two terms of one digit: the untrained model's mean reward in the calibration band
TERMS = 2


@dataclass(frozen=True)
class ChatChainSumTask(ChatTask):
    """The sum of ``length`` one-digit terms joined by ``+`` and ``-``, asked in words."""

    length: int = TERMS

    name: ClassVar[str] = "chat_chain_sum"
    about: ClassVar[str] = "a chat model: 'State the final answer ...: 4 - 7 =', the last number"
    gym_name: ClassVar[str] = "chain_sum"
    instruction: ClassVar[str] = "Reply with the number only."
    answer_pattern: ClassVar[re.Pattern[str]] = NUMBER
    format_pattern: ClassVar[re.Pattern[str]] = re.compile(NUMBER.pattern + r"\.?")

    def config(self) -> dict[str, Any]:
        return {"min_terms": self.length, "max_terms": self.length, "min_digits": 1,
                "max_digits": 1}  # fmt: skip


TASK = ChatChainSumTask()
