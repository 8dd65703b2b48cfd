"""A reward function checked against the call TRL makes of it, before any model is loaded.

``GRPOTrainer`` calls each reward function (one that is not a model) with keyword arguments
only (``trl/trainer/grpo_trainer.py``, ``_calculate_rewards``)::

    fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_extra=...,
       log_metric=..., **columns)

``columns``: every column of the training dataset but ``prompt``, ``completion`` and
``completion_ids``, one value per completion; ``environments=...`` too where the trainer has an
``environment_factory``. A function that cannot take that call (a parameter named otherwise
than the keywords and without a default, a keyword it does not take and no ``**kwargs``, a
positional-only parameter) failed only after the model was loaded and the first completions
generated, in a long traceback. :func:`check_reward` binds the call to the function's signature
instead: ``GMPOTrainer`` checks its reward functions when it is built, and ``gmpo train`` each
``--reward`` before TRL is imported, then against the dataset's columns once they are known.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable
from typing import Any

#: the keyword arguments GRPOTrainer passes every reward function beside the dataset's columns
TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra",
                "log_metric")  # fmt: skip
#: the dataset's columns that GRPOTrainer does not pass on
NOT_PASSED = ("prompt", "completion", "completion_ids")
CALL = "fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., " \
       "log_extra=..., log_metric=..., **columns)"  # fmt: skip


def reward_name(fn: Any) -> str:
    """A reward function's name as a message gives it (TRL's: its ``__name__``)."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        name = type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}:{name}" if module and module != "__main__" else str(name)


def is_model(fn: Any) -> bool:
    """A reward model (a ``torch.nn.Module``, which TRL calls on token ids) or a model's name,
    which TRL loads: neither is called with the keywords."""
    if isinstance(fn, str):
        return True
    torch = sys.modules.get("torch")  # not imported: fn cannot be a Module
    return torch is not None and isinstance(fn, torch.nn.Module)


def check_reward(
    fn: Callable[..., Any], columns: Iterable[str] | None = None, *, environments: bool = False
) -> None:
    """A TypeError of one line where TRL's call of ``fn`` cannot bind to its signature.

    ``columns``: the training dataset's columns; None where they are not known yet, and then
    only what does not depend on them is checked (a parameter without a default that is no
    keyword of TRL's is then taken for a column). ``environments``: the trainer has an
    ``environment_factory`` (TRL then passes ``environments`` too). A callable whose signature
    cannot be read (a builtin) is not checked."""
    if is_model(fn):
        return
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    passed = list(TRL_KEYWORDS) + (["environments"] if environments else [])
    known = columns is not None
    if columns is not None:
        passed += [c for c in columns if c not in NOT_PASSED and c not in passed]
    params = signature.parameters.values()
    name = reward_name(fn)
    for p in params:
        if p.kind is p.POSITIONAL_ONLY:
            raise TypeError(
                f"reward function {name}: TRL calls it with keywords only, as {CALL}, and its "
                f"parameter {p.name!r} is positional-only (before '/')"
            )
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unexpected = [k for k in passed if k not in named]
    if unexpected and not takes_any:
        extra = "" if len(unexpected) == 1 else "s"
        raise TypeError(
            f"reward function {name}: TRL calls it as {CALL}, and it takes no keyword{extra} "
            f"{', '.join(map(repr, unexpected))}: add **kwargs to its parameters"
        )
    required = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.default is p.empty and p.name not in passed]  # fmt: skip
    if required and known:
        have = ", ".join(c for c in columns or () if c not in NOT_PASSED) or "none but prompt"
        raise TypeError(
            f"reward function {name} needs the dataset column{'s' if len(required) > 1 else ''} "
            f"{', '.join(map(repr, required))}, which the dataset does not have (TRL passes "
            f"each column as a keyword; columns: {have})"
        )


def check_rewards(reward_funcs: Any, train_dataset: Any = None, **kwargs: Any) -> None:
    """:func:`check_reward` of each of ``reward_funcs`` (one, or a list, as GRPOTrainer takes
    them) against ``train_dataset``'s columns (where it has them: an iterable dataset may not);
    ``kwargs``: :func:`check_reward`'s ``environments``."""
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    columns = getattr(train_dataset, "column_names", None)
    if not isinstance(columns, list | tuple):
        columns = None
    for fn in funcs:
        check_reward(fn, columns, **kwargs)
