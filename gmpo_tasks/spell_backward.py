"""reasoning-gym's ``spell_backward``: spell a word backward, answers of varying length.

The gym's entry (``create_dataset("spell_backward", min_word_len=3, max_word_len=L)``: a word of
3 to ``L`` letters from its word list) asks "Spell this word backward (example: sun -> nus):
splat"; the compact prompt is the metadata's word padded on the left with ``.`` to ``L``
letters, then ``=``: ``"...splat="`` at ``L = 8``, so that every prompt has one length and the
word's last letter always sits just before ``=``. The answer is the gym's, ``"talps"`` (3 to
``L`` letters, upper and lower case), then the end-of-sequence token. The reward is the gym's
``score_answer``: case-insensitive, 1.0 for the word reversed, else the fraction of its
positions that match (0.8 at most for a completion that runs past a right answer).

Settings: the calibration rule of ``studies.stability.calibrate`` on the calibration seeds only
(results/tasks-gym/calibration_spell_backward.md), which keeps every seed's warm start in a
band away from zero reward.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gmpo_tasks.chars import SEP
from gmpo_tasks.gym import GymTask
from gmpo_tasks.task import Backward
from gmpo_tasks.warm_start import WarmStart

#: the calibrated setting (results/tasks-gym/calibration_spell_backward.md): words of 3 to 8
#: letters, 400 supervised steps (a clean warm start already spells them back) and noise 0.6
#: (the smallest that put every seed in [0.15, 0.45]: 0.409, 0.401, 0.437)
LENGTH = 8
NOISE = 0.6
WARM = WarmStart(steps=400)
PAD = "."
LETTERS = string.ascii_lowercase + string.ascii_uppercase
MIN_WORD = 3  # the gym's shortest word


@dataclass(frozen=True)
class SpellBackwardTask(Backward, GymTask):
    """Reverse a word of 3 to ``length`` letters, left-padded to ``length``."""

    length: int = LENGTH
    noise: float = NOISE
    warm: WarmStart = field(default=WARM)

    name: ClassVar[str] = "spell_backward"
    about: ClassVar[str] = "words of 3 to 8 letters, prompt '...splat=', answers of 3 to 8 letters"
    alphabet: ClassVar[str] = LETTERS + PAD + SEP
    symbols: ClassVar[str] = LETTERS + PAD + SEP
    answer_chars: ClassVar[str] = LETTERS
    variable_length: ClassVar[bool] = True
    quick_length: ClassVar[int] = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if not MIN_WORD <= self.length <= 10:
            raise ValueError(
                f"length must be from 3 to 10 (the gym's word list), got {self.length}"
            )

    def config(self) -> dict[str, Any]:
        return {"min_word_len": MIN_WORD, "max_word_len": self.length}

    def compact(self, entry: dict[str, Any]) -> str:
        return entry["metadata"]["word"].rjust(self.length, PAD) + SEP

    def rebuild(self, prompt: str) -> dict[str, Any]:
        """The word reversed is the gym's answer (all that its score_answer reads)."""
        word = prompt.removesuffix(SEP).lstrip(PAD)
        return {"answer": word[::-1], "metadata": {"word": word, "word_len": len(word)}}

    def answer(self, entry: dict[str, Any]) -> str:
        return str(entry["answer"])


TASK = SpellBackwardTask()
