"""The losses ``gmpo compare --against`` trains beside GMPO, each through TRL's own
``GRPOTrainer`` with its ``loss_type``: the ``GRPOConfig`` values each one forces, and where they
come from (docs/losses.md, "Compare on your own task", states the same). Every other value is the
run's, the same for every method: the task's or the user's, GRPOConfig's defaults below them.
``epsilon`` is forced for each, since GMPO's ``--epsilon`` is a log-space bound. Pure data: no
TRL import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Comparator:
    """``label``: the method's name in the tables and the plot; ``settings``: the
    ``GRPOConfig`` values it forces; ``source``: where they come from."""

    label: str
    settings: dict[str, Any]
    source: str


#: by ``--against`` name; ``grpo``'s ``epsilon`` is ``--grpo_epsilon`` (default 0.2, TRL's
#: default)
COMPARATORS: dict[str, Comparator] = {
    "grpo": Comparator(
        "GRPO",
        {"loss_type": "grpo", "epsilon": 0.2, "epsilon_high": None},
        "TRL's loss_type='grpo', a token mean per sequence; epsilon: --grpo_epsilon",
    ),
    "dapo": Comparator(
        "DAPO",
        {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28},
        "the DAPO paper's clip-higher (arXiv 2503.14476, Sec. 4.1), as TRL's paper index and "
        "its epsilon_high documentation give it; no delta (TRL's default: no dual clip)",
    ),
    "dapo_trl": Comparator(
        "DAPO_TRL",
        {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": None},
        "TRL's default loss: GRPOConfig's loss_type='dapo' at its default epsilon 0.2, "
        "epsilon_high unset (so 0.2), no delta",
    ),
    "gspo": Comparator(
        "GSPO",
        {
            "loss_type": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
        "TRL's paper index (the GSPO paper v2, Sec. 5.1; beta 0 there, the run's default)",
    ),
    "cispo": Comparator(
        "CISPO",
        {"loss_type": "cispo", "epsilon": 0.2, "epsilon_high": 5.0},
        "TRL's epsilon_high documentation (ScaleRL, arXiv 2510.13786): the weight's cap; TRL's "
        "CISPO has no lower clip, epsilon is TRL's default",
    ),
    "sapo": Comparator(
        "SAPO",
        {
            "loss_type": "sapo",
            "epsilon": 0.2,
            "epsilon_high": None,
            "sapo_temperature_pos": 1.0,
            "sapo_temperature_neg": 1.05,
        },
        "TRL's defaults (the SAPO paper, arXiv 2511.20347); no clip",
    ),
}

#: ``--against``'s default: ``gmpo compare`` as it always was, GRPO against GMPO
DEFAULT_AGAINST = "grpo"
