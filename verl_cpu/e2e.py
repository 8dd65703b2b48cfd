"""verl's trainer on CPU, for ``smoke_test_cpu.sh``, ``tests/verl/test_main_ppo.py``,
``tests/verl/test_main_ppo_real.py`` and ``verl_cpu/figures.py`` alike: the files a user would
bring to ``python -m verl.trainer.main_ppo`` (a model, its tokenizer, parquet data, a reward
function file), the CPU overrides, and a parser for the trainer's console step lines.

Also a command line for ``examples/verl/smoke_test_cpu.sh``: ``python -m verl_cpu.e2e
prepare DIR [MODEL] | smoke-overrides [STEPS [tiny|real]] | cpu-overrides | env``.

Two setups, the same functions (:func:`prepare` with or without ``model``, the :class:`Sizes`
of each):

- the tiny one (:data:`TINY`, the default): a tiny Qwen2 model with random weights built here,
  its character tokenizer, and ``successor``'s task (``gmpo_tasks.successor``): the prompt is
  ``d=``, the answer ``d+1 mod 10``. The reward is dense enough (a share of digit characters
  besides the exact answer) that GRPO's advantages are not all zero on a random model.
- a real model (:data:`REAL`): a local model directory with a chat template (SmolLM2-135M-Instruct,
  ``gmpo_tasks.pretrained``), its own tokenizer, and ``chat_chain_sum``'s chat prompts
  (``gmpo_tasks.chat_chain_sum``: reasoning-gym's ``chain_sum`` questions as user messages),
  scored by that task's reward (reasoning-gym's ``score_answer`` of the reply's last integer)
  with a closeness term for a wrong integer, at lengths and batch sizes that two CPU cores run
  in minutes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmpo_tasks.chars import char_tokenizer
from gmpo_tasks.models import qwen2_model
from gmpo_tasks.successor import TASK as SUCCESSOR
from verl_cpu.console import plain as plain  # the tests read a log through e2e
from verl_cpu.console import step_lines as step_lines
from verl_cpu.console import step_metrics

REPO = Path(__file__).resolve().parents[1]
SUPPORT_MODULE = "verl_cpu.cpu_support"
ENGINE_WORKER = Path(__file__).with_name("engine_worker.py")
# the tokenizer: characters, plus what verl's Qwen continuous-token builder needs ("\n" as one
# token and <|im_end|>); a Qwen-style chat template
SPECIALS = ("<pad>", "<|im_start|>", "<|im_end|>")
CHARS = "\n =0123456789abcdefghijklmnopqrstuvwxyz"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
REWARD_FILE = '''\
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1 for the right first character, plus the share of digits in the answer."""
    text = solution_str.replace("<|im_end|>", "")
    exact = float(text[:1] == ground_truth)
    return exact + sum(c.isdigit() for c in text) / max(len(text), 1)
'''
# the real model's reward: chat_chain_sum's own (gmpo_tasks.chat), the gym's entry in extra_info,
# and a closeness term that makes it dense enough for groups of 4 (see REAL)
REAL_REWARD_FILE = '''\
import json

from gmpo_tasks.chat_chain_sum import TASK


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """reasoning-gym's score_answer of the reply's last integer against the question's entry
    (1.0 for the answer, partial credit for a number that contains it: chat_chain_sum's reward),
    or, where higher, 0.5 / (1 + |integer - answer|) for a wrong integer; 0 without one."""
    entry = json.loads(extra_info["entry"])
    if str(entry["answer"]) != str(ground_truth):
        raise ValueError(f"the entry's answer {entry['answer']!r} is not {ground_truth!r}")
    answer = TASK.extract(solution_str)
    if not answer:
        return 0.0
    closeness = 0.5 / (1 + abs(int(answer) - int(ground_truth)))
    return max(TASK.score(answer, entry), closeness)
'''
PROMPT_LENGTH, RESPONSE_LENGTH = 32, 8


@dataclass(frozen=True)
class Sizes:
    """A setup's lengths, learning rate and batch: ``batch`` prompts a step, ``n`` rollouts
    each, updated in mini-batches of ``mini_batch`` prompts for ``epochs`` passes (every
    mini-batch after the first is off-policy)."""

    prompt_length: int
    response_length: int
    lr: float
    batch: int
    n: int
    mini_batch: int
    epochs: int
    micro_batch: int  # sequences per micro-batch of the update
    log_prob_micro_batch: int  # sequences per micro-batch of the old log-probs


#: the tiny Qwen2: 4 prompts x 4 samples, 2 mini-batches x 2 epochs (so the clip acts), large
#: steps (a random 20k-parameter model)
TINY = Sizes(PROMPT_LENGTH, RESPONSE_LENGTH, lr=0.02, batch=4, n=4, mini_batch=2, epochs=2,
             micro_batch=4, log_prob_micro_batch=8)  # fmt: skip
#: the real 135M model on two cores: chat_chain_sum's prompts are 53 tokens under SmolLM2's chat
#: template; 2 prompts x 4 samples of at most 16 tokens (its replies end after 10 to 12 on
#: average), 2 mini-batches x 1 epoch (the second update is off-policy), the learning rate of
#: ``make train-real`` (gmpo_tasks.chat.RealCell). At temperature 1 the untrained model answers
#: right about one time in five: with the gym's score alone, a step's 8 replies all scored 0 in
#: a run (no advantage, no update), hence the reward's closeness term
REAL = Sizes(prompt_length=64, response_length=16, lr=2e-5, batch=2, n=4, mini_batch=1,
             epochs=1, micro_batch=4, log_prob_micro_batch=8)  # fmt: skip
#: what loss_mode=gmpo (and gmpo_dual_clip) logs every step
GMPO_METRICS = (
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/log_ratio_min",
    "actor/log_ratio_max",
)


def build_tokenizer(path: Path) -> Any:
    """gmpo_tasks' character tokenizer with a chat template's special tokens."""
    tok = char_tokenizer(alphabet=CHARS, specials=SPECIALS, eos="<|im_end|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return tok


def build_model(path: Path, tokenizer: Any) -> None:
    """gmpo_tasks' tiny Qwen2-style model (its own output layer), random weights of seed 0."""
    qwen2_model(tokenizer, seed=0, tied=False).save_pretrained(path)


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path)


def build_data(path: Path, n: int = 32, seed: int = 0) -> None:
    """``n`` of the successor task's prompts as verl's chat rows, its answer the ground truth."""
    rows = [
        {
            "data_source": "successor",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "toy",
            "reward_model": {"style": "rule", "ground_truth": SUCCESSOR.target(prompt)},
            "extra_info": {"index": i},
        }
        for i, prompt in enumerate(SUCCESSOR.prompts(n, seed=seed))
    ]
    _write_rows(path, rows)


def build_chat_data(path: Path, n: int = 16, seed: int | str = "verl") -> None:
    """``n`` of chat_chain_sum's prompts as verl's rows: the ``prompt`` column a list of chat
    messages (verl applies the tokenizer's chat template), the gym's answer the ground truth,
    the gym's entry (as JSON) in ``extra_info`` for the reward."""
    from gmpo_tasks.chat_chain_sum import TASK

    rows = [
        {
            "data_source": TASK.name,
            "prompt": TASK.messages(entry),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": TASK.answer(entry)},
            "extra_info": {"index": i, "entry": json.dumps(entry)},
        }
        for i, entry in enumerate(TASK.entries(n, seed=seed))
    ]
    _write_rows(path, rows)


def prepare(workdir: Path, model: Path | str | None = None) -> dict[str, Path]:
    """The files of a run in ``workdir``: without ``model``, the tiny setup (the model, its
    tokenizer in its own folder, the successor data, its reward file); with ``model``, a local
    model directory with a chat template (used in place, its own tokenizer), chat_chain_sum's
    data and reward file. Run it with the :class:`Sizes` of the setup (:data:`TINY`,
    :data:`REAL`)."""
    paths = {"data": workdir / "train.parquet", "reward": workdir / "reward.py"}
    if model is None:
        paths |= {"model": workdir / "model", "tokenizer": workdir / "tokenizer"}
        tokenizer = build_tokenizer(paths["tokenizer"])
        build_model(paths["model"], tokenizer)
        build_data(paths["data"])
        paths["reward"].write_text(REWARD_FILE)
        return paths
    model = Path(model).resolve()
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model}: not a local model directory (no config.json)")
    paths |= {"model": model, "tokenizer": model}
    build_chat_data(paths["data"])
    paths["reward"].write_text(REAL_REWARD_FILE)
    return paths


def user_overrides(
    paths: dict[str, Path], workdir: Path, loss_mode: str = "gmpo", sizes: Sizes = TINY
) -> list[str]:
    """What a user brings: GMPO's settings (as in docs/verl.md) and the files."""
    data = str(paths["data"])
    return [
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.clip_ratio_low=0.4",
        "actor_rollout_ref.actor.clip_ratio_high=0.4",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.optim.lr={sizes.lr}",
        f"data.train_files=['{data}']",
        f"data.val_files=['{data}']",
        f"data.max_prompt_length={sizes.prompt_length}",
        f"data.max_response_length={sizes.response_length}",
        f"actor_rollout_ref.model.path={paths['model']}",
        f"actor_rollout_ref.model.tokenizer_path={paths['tokenizer']}",
        f"reward.custom_reward_function.path={paths['reward']}",
        "reward.custom_reward_function.name=compute_score",
        f"trainer.default_local_dir={workdir / 'checkpoints'}",
        "trainer.project_name=gmpo_e2e",
        "trainer.experiment_name=cpu",
    ]


def smoke_overrides(steps: int = 3, sizes: Sizes = TINY) -> list[str]:
    """A few small, off-policy steps of ``sizes`` (by default 4 prompts x 4 samples, 2
    mini-batches x 2 epochs per step, so the clip acts), console logging, no validation, no
    checkpoints."""
    return [
        f"data.train_batch_size={sizes.batch}",
        f"actor_rollout_ref.rollout.n={sizes.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={sizes.mini_batch}",
        f"actor_rollout_ref.actor.ppo_epochs={sizes.epochs}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={sizes.micro_batch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={sizes.log_prob_micro_batch}",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=['console']",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
    ]


#: What verl 0.9.1 needs on a CPU (with :mod:`verl_cpu.cpu_support` loaded, see
#: :func:`environment`); on GPUs none of these is needed (docs/verl.md says what differs).
CPU_OVERRIDES = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "+ray_kwargs.ray_init.num_gpus=1",  # logical GPUs: verl's resource check counts GPUs
    "ray_kwargs.ray_init.num_cpus=16",  # logical CPUs for verl's many small actors
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",  # not bf16
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    "actor_rollout_ref.model.use_remove_padding=False",  # needs flash-attn
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.rollout.name=hf",  # verl_cpu/hf_rollout.py, not vLLM
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.calculate_log_probs=True",  # training/rollout_probs_diff_*
    "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "data.dataloader_num_workers=0",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
)


def overrides(paths: dict[str, Path], workdir: Path, *, v1: bool = True, loss_mode: str = "gmpo",
              steps: int = 3, sizes: Sizes = TINY) -> list[str]:  # fmt: skip
    """The test's overrides: the user's, the smoke test's, then what CPU needs."""
    user = user_overrides(paths, workdir, loss_mode, sizes)
    return [*user, *smoke_overrides(steps, sizes), *CPU_OVERRIDES, f"trainer.use_v1={v1}"]


def environment(**extra: str) -> dict[str, str]:
    """The trainer's environment: the CPU support in every process, no trl workaround."""
    env = dict(os.environ)
    env.update(
        VERL_PLATFORM="cpu",
        VERL_ENGINE_DEVICE="cuda",  # verl's engine registry has accelerator keys only
        VERL_USE_EXTERNAL_MODULES=SUPPORT_MODULE,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        RAY_DEDUP_LOGS="0",
        RAY_USAGE_STATS_ENABLED="0",
        HF_HUB_OFFLINE="1",
        WANDB_MODE="disabled",
    )
    env.update(extra)
    return env


def launch_engine(nproc: int, workdir: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """``torchrun --nproc_per_node NPROC engine_worker.py WORKDIR/model WORKDIR/result.json
    ARGS`` started in its own process group (so that torchrun and its workers end together);
    returns the process and the path of the JSON report it writes."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    out = workdir / "result.json"
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [torchrun, "--standalone", "--nproc_per_node", str(nproc), str(ENGINE_WORKER),
         str(workdir / "model"), str(out), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir,
        start_new_session=True,
    )  # fmt: skip
    return proc, out


def compose_config(overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config composed with ``overrides``, as ``main_ppo`` composes it."""
    import hydra
    import verl

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with hydra.initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra.compose(config_name="ppo_trainer", overrides=overrides)


def run(workdir: Path, args: list[str], timeout: float, **env: str) -> tuple[int, str]:
    """``python -m verl.trainer.main_ppo ARGS`` in WORKDIR -> (exit code, stdout + stderr).

    In its own process group: on a timeout the driver and the Ray cluster it started (GCS,
    raylet, workers) are killed together, and the test fails with the log so far."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl.trainer.main_ppo", *args],
        cwd=workdir, env=environment(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        return -9, f"{log}\n[timed out after {timeout} s]"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, log


def main(argv: list[str]) -> int:
    """``prepare DIR [MODEL]``: build the files (with MODEL, a local model directory: the real
    model's), print their overrides; ``smoke-overrides [STEPS [tiny|real]]``, ``cpu-overrides``:
    print those; ``env``: print the environment as ``export`` lines; ``summary LOG``: gmpo's
    metrics from a run's log (exit 1 without them)."""
    command = argv[0] if argv else ""
    if command == "prepare" and len(argv) in (2, 3):
        workdir = Path(argv[1]).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        model = argv[2] if len(argv) == 3 else None
        sizes = TINY if model is None else REAL
        print("\n".join(user_overrides(prepare(workdir, model), workdir, sizes=sizes)))
    elif command == "smoke-overrides" and len(argv) <= 3 and argv[2:] in ([], ["tiny"], ["real"]):
        sizes = REAL if argv[2:] == ["real"] else TINY
        print("\n".join(smoke_overrides(int(argv[1]) if len(argv) > 1 else 3, sizes)))
    elif command == "cpu-overrides":
        print("\n".join(CPU_OVERRIDES))
    elif command == "summary" and len(argv) == 2:  # gmpo's metrics per step; 1 if missing
        steps = step_metrics(Path(argv[1]).read_text(errors="replace"))
        for step, metrics in sorted(steps.items()):
            shown = {k: f"{v:.4g}" for k, v in metrics.items() if k in GMPO_METRICS}
            print(f"step:{step}", " ".join(f"{k}:{v}" for k, v in shown.items()))
        if not steps or not all(key in m for m in steps.values() for key in GMPO_METRICS):
            print("no gmpo metrics in the step lines: is loss_mode=gmpo set?")
            return 1
    elif command == "env":
        keys = ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_USE_EXTERNAL_MODULES", "PYTHONPATH",
                "TOKENIZERS_PARALLELISM", "RAY_USAGE_STATS_ENABLED", "HF_HUB_OFFLINE")  # fmt: skip
        env = environment()
        print("\n".join(f"export {key}={shlex.quote(env[key])}" for key in keys))
    else:
        print(main.__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
