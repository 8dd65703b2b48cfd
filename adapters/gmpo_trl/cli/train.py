"""``gmpo train``: one GMPO run (the toy run unless ``--model`` is given)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gmpo_trl.cli.checks import check_inputs, check_vllm
from gmpo_trl.cli.parsing import Parsed
from gmpo_trl.cli.runs import quiet, run


@dataclass
class ScriptArguments:
    """What to train on (the rest is GMPOConfig)."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Local model directory (as save_pretrained writes it) or hub id. "
            "Default: the built-in toy run (a tiny Qwen2-style model on the successor task)."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Dataset hub id, local directory, or .json/.jsonl/.csv/.parquet file with a "
            "'prompt' column. Default: the built-in toy task."
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "Dataset split."})
    task: str = field(
        default="successor",
        metadata={
            "help": "The built-in task, for what --model, --dataset or --reward does not name: "
            "'successor' (the toy run) or 'reverse' (reverse 16 digits, exact match; a tiny "
            "GPT-2-style model warm-started on noisy demonstrations; without --model, the "
            "setting of docs/study.md instead of the toy values: 100 generations of 16 prompts "
            "x 8 completions, 16 optimizer steps on each (steps_per_generation=8, "
            "num_iterations=2), learning_rate=0.002, max_grad_norm=0).",
            "choices": ["successor", "reverse"],
        },
    )
    reward: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Reward function(s) as module:function (the module in the current directory "
            "or on PYTHONPATH). Default: the toy task's."
        },
    )


def main(parsed: Parsed) -> Path:
    """``gmpo train``: returns the output directory."""
    from gmpo_trl import GMPOConfig, GMPOTrainer

    config = parsed.config(GMPOConfig)
    check_inputs(parsed.script)
    check_vllm(parsed.script, config)
    quiet()
    done = run(parsed.script, config, GMPOTrainer, "gmpo train")
    done.trainer.save_model(str(Path(config.output_dir) / "final"))
    return Path(config.output_dir)
