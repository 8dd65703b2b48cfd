"""``gmpo train``: one GMPO run (the toy run unless ``--model`` is given)."""

from __future__ import annotations

from pathlib import Path

from gmpo_trl.cli.checks import check_inputs
from gmpo_trl.cli.parsing import Parsed
from gmpo_trl.cli.runs import quiet, run


def main(parsed: Parsed) -> Path:
    """``gmpo train``: returns the output directory."""
    from gmpo_trl import GMPOConfig, GMPOTrainer

    config = parsed.config(GMPOConfig)
    check_inputs(parsed.script)
    quiet()
    done = run(parsed.script, config, GMPOTrainer, "gmpo train")
    done.trainer.save_model(str(Path(config.output_dir) / "final"))
    return Path(config.output_dir)
