"""``GMPOTrainer``: TRL's ``GRPOTrainer`` with GMPO as its policy loss.

Only ``_compute_loss`` is overridden (TRL has no narrower hook: the GRPO loss, its host terms and
its metrics live in that one method). It unpacks the host's inputs, asks GRPOTrainer's own
helpers for the masks (``get_high_entropy_mask``, ``get_off_policy_mask``) and the forward pass
(``_get_per_token_logps_and_entropies``), calls :func:`gmpo_core.gmpo_loss` for all GMPO math,
then adds the host terms that are not GMPO (entropy bonus with its adaptive controller, MoE
router aux loss) with GRPOTrainer's semantics and state, and reduces the metrics exactly across
processes. Everything else (generation, rewards, advantages, vLLM, saving) is GRPOTrainer's.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar

import torch
from torch import Tensor
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer

from gmpo_kit import MetricStates, add_core_stats, core_metrics, gmpo_loss_with_kl, read
from gmpo_tasks import pretrained
from gmpo_trl import resume, variant, vllm_cpu
from gmpo_trl.compat import check_compute_loss, check_liger, forward_keys
from gmpo_trl.config import HOST, Checked, GMPOConfig, check_config
from gmpo_trl.head_swap import lm_head_swapped
from gmpo_trl.rewards import check_rewards
from gmpo_variants import Variant

FORWARD_KEYS = forward_keys()
RESUME_STATE = resume.RESUME_STATE
# the adaptive entropy controller's window mean, read with the metrics (not logged)
_WORLD_ENTROPY = "_world_entropy"
# the token counts of the entropy and KL metrics (states, not logged)
_ENTROPY_TOKENS, _KL_TOKENS = "entropy/tokens", "kl/tokens"


class GMPOTrainer(GRPOTrainer):
    """Geometric-Mean Policy Optimization (arXiv 2507.20673) on TRL's ``GRPOTrainer``.

    A drop-in for ``trl.experimental.gmpo.GMPOTrainer`` (same arguments) that drops none of
    GRPOTrainer's loss features: vLLM importance-sampling correction (all four modes), the
    off-policy mask, ``top_entropy_quantile``, ``tool_mask``, the entropy bonus and its adaptive
    controller, the MoE aux loss, ``delta`` (dual clip) and ``beta``. Fields GMPO cannot honour
    are refused by :class:`GMPOConfig`. ``gmpo_trl.fields.FIELDS`` lists every field.

    Metrics (reduced exactly across processes): ``clip_ratio/low_mean``, ``high_mean``,
    ``region_mean``, ``low_min``, ``high_max`` (over the tokens the policy term reads),
    ``log_ratio/min``, ``log_ratio/max``, ``clip_ratio/dual_mean`` (with ``delta``), ``kl``,
    ``entropy``, and ``policy_loss``, ``entropy_coef``, ``aux_loss`` where GRPOTrainer logs them.

    With ``loss_variant`` (resolved by :func:`gmpo_trl.config.check_config`), the variant's
    function takes ``gmpo_loss``'s place in the loss step; the metrics are then
    ``variant/clip_ratio`` (its clipped fraction, a token mean over processes),
    ``log_ratio/min``, ``log_ratio/max``, ``entropy`` and the host terms' (no ``clip_ratio/*``:
    the core's clip did not run).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "gmpo"]
    #: a gmpo_core backend ("torch" or "triton") forced on this trainer's LM head where
    #: ``gmpo_lm_head`` picks gmpo_core's; None: ``gmpo_trl.head_swap.head_for``'s (benchmarks)
    gmpo_lm_head_backend: str | None = None

    def __init__(
        self,
        model: Any,
        reward_funcs: Any,
        args: GRPOConfig | None = None,
        *,
        checked: Checked | None = None,
        **kwargs: Any,
    ) -> None:
        """``checked``: ``check_config(args)``, where the caller has it (``gmpo``'s command line
        hands over its run plan's); without it the trainer checks ``args`` itself, once per
        set of values (a config unchanged since its construction is not checked again)."""
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path or "model"
            args = GMPOConfig(f"{str(name).split('/')[-1]}-GMPO")
        if not isinstance(args, GMPOConfig):
            raise TypeError(
                f"args must be a gmpo_trl.GMPOConfig, got {type(args).__module__}."
                f"{type(args).__name__}: build a GMPOConfig with the same arguments "
                "(epsilon is a log-space bound there, as in trl.experimental.gmpo)"
            )
        if checked is None:
            checked = check_config(args)
        check_liger(args.use_liger_kernel)
        check_compute_loss()
        # each reward function takes TRL's call (before the model loads, not at the first step)
        check_rewards(reward_funcs, kwargs.get("train_dataset"),
                      environments=kwargs.get("environment_factory") is not None)  # fmt: skip
        model = builtin_model(model)  # "smollm2-135m": its local directory, as `gmpo train` does
        vllm_cpu.prepare(model, args)  # use_vllm: checks and the CPU workaround, before the engine
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self._variant: Variant | None = checked.variant  # loss_variant(args), the check's

    # ------------------------------------------------------------------------------------------
    # checkpoints: what GRPOTrainer's own files leave out
    # ------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """GRPOTrainer's checkpoint (weights, optimizer, scheduler, RNG states, trainer state and
        the entropy controller's ``entropy_ctrl_state.json``), plus, per process,
        :data:`RESUME_STATE` (:mod:`gmpo_trl.resume`, written atomically): the micro-batch
        counter ``_step``, the accumulation window's entropy sums, the buffered rollouts when
        the checkpoint falls inside a generation's buffer (``steps_per_generation *
        num_iterations`` micro-batches), which GRPOTrainer would otherwise regenerate from new
        samples on resuming, and the number of processes."""
        super()._save_checkpoint(model, trial)
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        os.makedirs(folder, exist_ok=True)
        every = self.args.steps_per_generation * self.num_iterations
        state = {
            "step": self._step,
            "generate_every": every,
            "steps_per_generation": self.args.steps_per_generation,
            "entropy_window_stats": self._entropy_window_stats,
            "buffered_inputs": self._buffered_inputs if self._step % every else None,
            "world_size": self.accelerator.num_processes,
        }
        resume.save(folder, self.accelerator.process_index, state)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """GRPOTrainer's (which restores the entropy controller), then :data:`RESUME_STATE`,
        where every process can restore its own (:func:`gmpo_trl.resume.agree`; else each
        resumes as GRPOTrainer does, with a warning)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        acc = self.accelerator
        rank, world = acc.process_index, acc.num_processes
        state, why = resume.read(checkpoint, rank, world, acc.device)
        restore, warning = resume.agree(state, why, rank, acc.gather, acc.device)
        if warning is not None:
            warnings.warn(warning, stacklevel=2)
        if not restore:
            return
        self._step = state["step"]
        self._entropy_window_stats = state["entropy_window_stats"]
        every = self.args.steps_per_generation * self.num_iterations
        same = (state["generate_every"], state["steps_per_generation"]) == (
            every, self.args.steps_per_generation
        )  # fmt: skip
        self._buffered_inputs = state["buffered_inputs"] if same else None
        if not same and state["buffered_inputs"] is not None:
            warnings.warn(
                "gmpo_trl: the checkpoint's buffered rollouts were made with "
                f"steps_per_generation * num_iterations = {state['generate_every']}, this run has "
                f"{every}: they are regenerated at the next step", stacklevel=2,
            )  # fmt: skip

    # ------------------------------------------------------------------------------------------
    # the loss step
    # ------------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        """GRPOTrainer's, with gmpo_core's LM head in place of TRL's where ``gmpo_lm_head``
        chooses it (for every scoring pass: current, old and reference log-probs alike; by
        default on the CPU and, with Triton, on CUDA: ``gmpo_trl.head_swap.head_for``), a head
        of this trainer's own settings."""
        if self.args.gmpo_lm_head is False:
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        with lm_head_swapped(
            self.args.gmpo_lm_head_backward, self.args.gmpo_lm_head, self.gmpo_lm_head_backend
        ):
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        completion_mask = inputs["completion_mask"]
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs.get(k) for k in FORWARD_KEYS},
        )  # logps, entropies: (B, T)

        mask = completion_tokens(inputs)  # (B, T) the host's valid tokens
        advantages = HOST.advantages(inputs["advantages"], mask)  # (B,)
        old_logps = inputs.get("old_per_token_logps")  # None: on-policy (logps.detach())

        # the tokens the policy term reads: minus low-entropy tokens, minus off-policy rows
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(
                entropies, mask, 1 - self.top_entropy_quantile
            )
        policy_mask = mask if entropy_mask is None else mask & entropy_mask
        off_policy = self.off_policy_mask_threshold is not None
        if off_policy:
            behaviour = logps.detach() if old_logps is None else old_logps
            keep = self.get_off_policy_mask(
                advantages=advantages.unsqueeze(1),
                per_token_logps=logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", behaviour),
                mask=mask.to(logps.dtype),
                off_policy_threshold=self.off_policy_mask_threshold,
            )  # (B, 1)
            policy_mask = policy_mask & keep.bool()

        is_weights = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            is_weights = inputs["importance_sampling_ratio"]  # (B, T) token modes, (B, 1) sequence

        beta = float(self.beta)
        ref_logps = inputs.get("ref_per_token_logps") if beta != 0.0 else None
        if beta != 0.0 and ref_logps is None:
            raise ValueError("beta != 0 needs inputs['ref_per_token_logps'] (the reference model)")
        states = MetricStates()  # what the metrics are made of, reduced across processes
        if self._variant is not None:  # loss_variant: its function in gmpo_loss's place
            loss, clipped, stats = variant.variant_loss(
                self._variant, logps, old_logps, advantages, policy_mask
            )
            variant.add_states(states, stats, clipped)
        else:
            # The KL keeps every host token, as in GRPOTrainer: when the policy term reads fewer
            # (entropy or off-policy mask), the KL is over the host mask.
            step = gmpo_loss_with_kl(
                logps,
                old_logps,
                advantages,
                policy_mask,
                kl_mask=mask if entropy_mask is not None or off_policy else None,
                beta=beta,
                ref_logp=ref_logps,
                is_weights=is_weights,
                epsilon=self.epsilon_low,
                epsilon_high=self.epsilon_high,
                dual_clip=self.args.delta,
                impl=self.args.gmpo_impl,
            )
            loss = step.loss
            add_core_stats(states, step.out.stats)
            if step.kl_sum is not None:
                states.sum("kl", step.kl_sum)
                states.sum(_KL_TOKENS, step.kl_tokens)
        states.sum("entropy", torch.where(mask, entropies.detach().to(torch.float64), 0).sum())
        states.sum(_ENTROPY_TOKENS, mask.sum())
        policy_loss = loss.detach()
        loss = loss / accumulation

        # host values read with the metrics, in the step's one device synchronization
        pending: dict[str, Tensor] = {}
        world_entropy = None
        if self._entropy_bonus_enabled:
            effective = mask if entropy_mask is None else mask & entropy_mask
            bonus, world_entropy = self._entropy_bonus(entropies, effective, mode, accumulation)
            loss = loss - bonus
            pending["policy_loss"] = self.accelerator.gather(policy_loss).nanmean()
            if world_entropy is not None:
                pending[_WORLD_ENTROPY] = world_entropy
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            pending["aux_loss"] = self.accelerator.gather_for_metrics(aux_loss).mean()

        values = self._metric_values(states)
        host = read({**values, **pending})  # the one sync
        metrics = self._metrics[mode]
        for key in values:
            metrics[key].append(host[key])
        if world_entropy is not None:
            self._update_entropy_coef(host[_WORLD_ENTROPY])
        for key in pending:
            if key != _WORLD_ENTROPY:
                metrics[key].append(host[key])
        if self._entropy_bonus_enabled and mode == "train" and self.accelerator.sync_gradients:
            metrics["entropy_coef"].append(self.entropy_coef)
        return loss

    def _metric_values(self, states: MetricStates) -> dict[str, Tensor]:
        """The logged metrics from ``states`` reduced exactly across processes (two
        collectives): sums summed, extrema the min of mins (maxima negated); the core's
        ``clip_ratio/*`` and ``log_ratio/*`` (the variant's own with ``loss_variant``), the
        entropy over the host's tokens and, with ``beta``, the KL over its own (NaN where there
        is no token)."""
        acc = self.accelerator
        reduced = states.reduce(
            sum=lambda t: acc.reduce(t, reduction="sum"),
            min=lambda t: acc.gather(t.unsqueeze(0)).amin(0),
        )
        if self._variant is not None:
            values = variant.metrics(reduced)
        else:
            values = core_metrics(reduced, dual=self.args.delta is not None)
        values["entropy"] = reduced.fraction("entropy", _ENTROPY_TOKENS)
        if "kl" in reduced:
            values["kl"] = reduced.fraction("kl", _KL_TOKENS)
        return values

    # ------------------------------------------------------------------------------------------
    # host terms that are not GMPO
    # ------------------------------------------------------------------------------------------

    def _entropy_bonus(
        self, entropies: Tensor, effective: Tensor, mode: str, accumulation: int
    ) -> tuple[Tensor, Tensor | None]:
        """``(coef * H, world)``: H the mean entropy over ``effective`` tokens, scaled for
        accumulation, with GRPOTrainer's coefficient and adaptive-controller state
        (``entropy_coef``, ``_last_world_entropy``, ``_entropy_window_stats``; saved in its
        checkpoints); ``world`` the window's mean entropy over all processes (0-d, on the
        device) where the adaptive controller closes its window, else None. The caller reads it
        with the metrics and passes it to :meth:`_update_entropy_coef`."""
        ent_sum = torch.where(effective, entropies, 0).sum()
        count = effective.sum()
        mean_entropy = ent_sum / count.clamp(min=1) / accumulation
        coef = self.entropy_coef
        if self.use_adaptive_entropy and self._last_world_entropy > self.args.entropy_target:
            coef = 0.0  # the gate from the end of the previous optimizer step
        world = None
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([ent_sum.detach(), count.to(ent_sum.dtype)])
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:
                total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world = total[0] / total[1].clamp(min=1.0)
                self._entropy_window_stats = None
        return coef * mean_entropy, world

    def _update_entropy_coef(self, world: float) -> None:
        """GRPOTrainer's adaptive controller step, from the window's mean entropy ``world``."""
        step = self.args.entropy_coef_delta
        if world <= self.args.entropy_target:
            self.entropy_coef = min(self.entropy_coef + step, self.args.entropy_coef_max)
        else:
            self.entropy_coef = max(self.entropy_coef - step, self.args.entropy_coef_min)
        self._last_world_entropy = world


def builtin_model(model: Any) -> Any:
    """``model`` as GRPOTrainer takes it: a built-in model's name (a key of
    ``gmpo_tasks.pretrained.MODELS``: ``"smollm2-135m"``) becomes its local directory,
    converted once into a cache on first use (``gmpo_tasks.pretrained.resolve``, the command
    line's resolver, which raises a one-line ValueError naming the install where the package
    that ships the model is missing); anything else (a hub id, a directory, a model) is
    returned as it is."""
    if isinstance(model, str) and model in pretrained.MODELS:
        return pretrained.resolve(model)
    return model


def completion_tokens(inputs: dict[str, Any]) -> Tensor:
    """The completion tokens a loss step reads, (B, T) bool: GRPOTrainer's ``completion_mask``
    without the tool-result tokens (``tool_mask``, when the batch has one)."""
    mask = inputs["completion_mask"].bool()
    if "tool_mask" in inputs:
        mask = mask & inputs["tool_mask"].bool()
    return mask
