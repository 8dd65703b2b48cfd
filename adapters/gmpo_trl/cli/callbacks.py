"""The callbacks of a ``gmpo`` run: every log appended to ``metrics.jsonl``, and the Trainer's
progress bar with the reward and the last off-policy log-ratio range as its postfix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gmpo_trl.cli.reports import has_range


def json_lines(path: Path) -> Any:
    """A callback that appends every log (one per logged step) to a JSON-lines file. The file
    starts with the logs of the trainer state the run begins from: none for a fresh run; for a
    resumed one, the checkpoint's (its ``log_history``: the rows of the steps up to the
    checkpoint, as they were written), so that rows of later steps written before are replaced
    by the resumed run's and each step appears once."""
    from transformers import TrainerCallback

    class JsonLines(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.is_world_process_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
                rows = [{"step": h["step"], **{k: v for k, v in h.items() if k != "step"}}
                        for h in state.log_history]  # fmt: skip
                path.write_text("".join(json.dumps(row) + "\n" for row in rows))

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
