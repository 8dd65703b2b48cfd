"""reasoning-gym's ``spell_backward`` for a chat model: a short word, the gym's question as a
user message, the answer the last word of the reply.

The user message is the gym's question and the answer format: "Spell this word backward
(example: sun -> nus): bird Reply with the reversed word only." The reward is the gym's
``score_answer`` of the reply's last word (case-insensitive: 1.0 for the word reversed, else
the fraction of its positions that match, 0.8 at most for a right answer that runs on).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from gmpo_tasks.chat import ChatTask

#: words of 3 letters: the untrained model's mean reward in the calibration band
LONGEST = 3
SHORTEST = 3  # the gym's shortest word


@dataclass(frozen=True)
class ChatSpellBackwardTask(ChatTask):
    """Spell a word of 3 to ``length`` letters backward, asked in words."""

    length: int = LONGEST

    name: ClassVar[str] = "chat_spell_backward"
    about: ClassVar[str] = "a chat model: 'Spell this word backward ...: bird', the last word"
    gym_name: ClassVar[str] = "spell_backward"
    instruction: ClassVar[str] = "Reply with the reversed word only."
    answer_pattern: ClassVar[re.Pattern[str]] = re.compile(r"[A-Za-z]+")
    format_pattern: ClassVar[re.Pattern[str]] = re.compile(r"[A-Za-z]+\.?")

    def config(self) -> dict[str, Any]:
        return {"min_word_len": SHORTEST, "max_word_len": self.length}


TASK = ChatSpellBackwardTask()
