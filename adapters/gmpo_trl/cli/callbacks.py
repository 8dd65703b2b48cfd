"""The callbacks of a ``gmpo`` run: every log appended to ``metrics.jsonl``, and the Trainer's
progress bar with the reward and the last off-policy log-ratio range as its postfix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gmpo_trl.cli.reports import has_range


def json_lines(path: Path) -> Any:
    """A callback that appends every log (one per logged step) to a JSON-lines file."""
    from transformers import TrainerCallback

    class JsonLines(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.is_world_process_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("")

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if state.is_world_process_zero and logs:
                with path.open("a") as f:
                    f.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    return JsonLines()


def quiet_progress_bar(trainer: Any) -> None:
    """The Trainer's progress bar, with the reward and the last off-policy log-ratio range as its
    postfix instead of a printed dict per logged step (they are in metrics.jsonl)."""
    from transformers.trainer_callback import ProgressCallback

    class Progress(ProgressCallback):  # type: ignore[misc]
        post: dict[str, str]

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if self.training_bar is None or not logs:
                return
            post = getattr(self, "post", {})
            if isinstance(logs.get("reward"), int | float):
                post["reward"] = f"{logs['reward']:.3g}"
            if has_range(logs):  # on-policy steps keep the last off-policy range
                post["log_r"] = f"[{logs['log_ratio/min']:.3g}, {logs['log_ratio/max']:.3g}]"
            self.post = post
            if post:
                self.training_bar.set_postfix(post, refresh=False)

    if any(isinstance(cb, ProgressCallback) for cb in trainer.callback_handler.callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(Progress)
