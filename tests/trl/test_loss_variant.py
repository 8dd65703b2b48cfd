"""``GMPOConfig.loss_variant`` (CHANGELOG, Unreleased): a loss of ``gmpo_variants`` by name or
``module:function`` in place of gmpo_core's loss in GMPOTrainer's loss step, the settings it
refuses, and ``gmpo compare --variant`` end to end on the toy task.

Loss and gradient are compared with ``tests.trl._support.assert_same`` (rtol 1e-5, atol 1e-7:
float32, the same model and inputs, where only the order of summation may differ).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

import torch

from gmpo_trl import GMPOConfig, GMPOTrainer
from gmpo_trl.trainer import completion_tokens
from gmpo_variants import VARIANTS
from gmpo_variants.gmpo import gmpo_variant as gmpo_method
from tests.trl._support import (
    TOKENIZER,
    assert_same,
    inputs_of,
    last_metrics,
    loss_and_grad,
    make_inputs,
    make_trainer,
)

pytestmark = pytest.mark.trl


def half_gmpo(logp, old_logp, advantages, mask):
    """A user's variant (``tests.trl.test_loss_variant:half_gmpo``): half of GMPO's loss."""
    loss, clipped = gmpo_method(logp, old_logp, advantages, mask)
    return 0.5 * loss, clipped


def no_fraction(logp, old_logp, advantages, mask):
    """The loss alone, as every recipe of docs/recipes.md returns it."""
    return gmpo_method(logp, old_logp, advantages, mask)[0]


def per_row(logp, old_logp, advantages, mask):
    """A result of the wrong shape: a loss per row."""
    return (logp - old_logp).sum(-1)


def _direct(trainer, inputs, fn):
    """``fn`` called on the trainer's own log-probs of ``inputs``: the loss, the clipped fraction
    and the flat gradient of every trainable parameter."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, attn, inputs["completion_ids"].size(1)
    )  # with the graph (model_logps has none)
    loss, clipped = fn(logps, inputs["old_per_token_logps"], inputs["advantages"],
                       completion_tokens(inputs))  # fmt: skip
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad = torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
                      for p in params])  # fmt: skip
    return loss.detach(), clipped, grad


@pytest.mark.parametrize(
    "name", ["gmpo_narrow", "gmpo_seqclip", "grpo", "tests.trl.test_loss_variant:half_gmpo"]
)
def test_variant_loss_step_is_its_function(tmp_path, name):
    """The loss step's loss, gradient and ``variant/clip_ratio`` are the variant's function on
    the same batch; the core's ``clip_ratio/*`` are not logged (its clip did not run)."""
    trainer = make_trainer(tmp_path, loss_variant=name)
    inputs = make_inputs(trainer, drift=0.5)
    loss, grad = loss_and_grad(trainer, inputs)
    fn = VARIANTS[name].loss if name in VARIANTS else half_gmpo
    want, clipped, want_grad = _direct(trainer, inputs, fn)
    assert_same(loss.detach(), want)
    assert_same(grad, want_grad)
    assert grad.abs().max() > 0
    metrics = last_metrics(trainer)
    assert metrics["variant/clip_ratio"] == pytest.approx(float(clipped), rel=1e-6, abs=1e-12)
    assert not any(k.startswith("clip_ratio/") for k in metrics), sorted(metrics)
    assert metrics["log_ratio/min"] < 0 < metrics["log_ratio/max"]
    default_loss, _ = loss_and_grad(make_trainer(tmp_path), inputs)
    assert not torch.allclose(loss, default_loss)  # the variant, not GMPO, ran


def test_clipped_fraction_is_seen_on_these_inputs(tmp_path):
    """The metric test above can fail: gmpo_narrow clips a part of these tokens, not none."""
    trainer = make_trainer(tmp_path, loss_variant="gmpo_narrow")
    loss_and_grad(trainer, make_inputs(trainer, drift=0.5))
    assert 0 < last_metrics(trainer)["variant/clip_ratio"] < 1


GMPO_AS_VARIANT = {
    "plain": ({}, {"drift": 0.5}),
    "on-policy": ({}, {}),
    "zero advantage": ({}, {"drift": 0.5, "zero_advantage": True}),
    "tool mask": ({}, {"drift": 0.5, "tool_mask": True}),
    "entropy quantile": ({"top_entropy_quantile": 0.5}, {"drift": 0.5}),
    "entropy bonus": ({"entropy_coef": 0.1}, {"drift": 0.5}),
}


@pytest.mark.parametrize("case", list(GMPO_AS_VARIANT))
def test_gmpo_method_as_module_function_is_the_default_gmpo(tmp_path, case):
    """``gmpo_variants.gmpo:gmpo_variant`` (``gmpo_loss`` at its defaults) through the variant
    hook gives the default GMPOTrainer's loss and gradient (to assert_same's float tolerance),
    with the masks and host terms the hook leaves to the trainer; its clipped fraction is the
    core's ``clip_ratio/region_mean``, and the range and entropy are the same."""
    config, spec = GMPO_AS_VARIANT[case]
    variant = make_trainer(tmp_path, loss_variant="gmpo_variants.gmpo:gmpo_variant", **config)
    default = make_trainer(tmp_path, **config)
    inputs = inputs_of(default, spec)
    loss, grad = loss_and_grad(variant, inputs)
    want, want_grad = loss_and_grad(default, inputs)
    assert_same(loss, want)
    assert_same(grad, want_grad)
    assert grad.abs().max() > 0
    got, ref = last_metrics(variant), last_metrics(default)
    assert got["variant/clip_ratio"] == pytest.approx(ref["clip_ratio/region_mean"], abs=1e-7)
    for key in ("log_ratio/min", "log_ratio/max", "entropy"):
        assert got[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-9) or (
            ref[key] != ref[key] and got[key] != got[key]  # both NaN
        ), key


REFUSED = [
    ({"loss_variant": "nope"}, "loss_variant: unknown variant 'nope': choose from grpo,"),
    ({"loss_variant": "no_such_module_xyz:f"},
     "loss_variant: variant 'no_such_module_xyz:f': no module 'no_such_module_xyz' found"),
    ({"loss_variant": "gmpo_variants.grpo:WIDE"},
     "loss_variant: variant 'gmpo_variants.grpo:WIDE' is float, not a function"),
    ({"loss_variant": 5}, "loss_variant: a variant is a name or module:function, got int 5"),
    ({"epsilon": 0.3}, "epsilon=0.3 does not apply to loss_variant='gmpo_narrow': the variant's"),
    ({"epsilon_high": 0.5}, "epsilon_high=0.5 does not apply to loss_variant='gmpo_narrow'"),
    ({"delta": 1.5}, "delta=1.5 does not apply to loss_variant='gmpo_narrow'"),
    ({"beta": 0.04}, "beta=0.04 does not apply to loss_variant='gmpo_narrow': a variant has no KL"),
    ({"gmpo_impl": "compiled"}, "gmpo_impl='compiled' does not apply to loss_variant="),
    ({"use_vllm": True},
     "vllm_importance_sampling_correction=True does not apply to loss_variant='gmpo_narrow'"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "match"), REFUSED)
def test_refused_at_construction_in_one_line(tmp_path, overrides, match):
    from gmpo_tasks.successor import toy_args

    kwargs = toy_args(str(tmp_path), **{"loss_variant": "gmpo_narrow", **overrides})
    with pytest.raises(ValueError) as err:
        GMPOConfig(**kwargs)
    assert str(err.value).startswith(match) and "\n" not in str(err.value), str(err.value)


def test_accepted_alongside_what_it_honours(tmp_path):
    """The masks and host terms the variant does not replace are accepted with it, and so is
    vLLM without the importance-sampling correction."""
    from gmpo_tasks.successor import toy_args

    config = GMPOConfig(**toy_args(str(tmp_path), loss_variant="gmpo", top_entropy_quantile=0.5,
                                   off_policy_mask_threshold=0.1, entropy_coef=0.01,
                                   use_vllm=True, vllm_importance_sampling_correction=False))  # fmt: skip
    assert config.loss_variant == "gmpo"


def test_trainer_refuses_a_field_set_after_construction(tmp_path):
    from gmpo_tasks.models import qwen2_model
    from gmpo_tasks.successor import successor_dataset, successor_reward, toy_args

    args = GMPOConfig(**toy_args(str(tmp_path), loss_variant="gmpo"))
    args.delta = 1.5
    with pytest.raises(ValueError, match=r"^delta=1\.5 does not apply to loss_variant='gmpo'"):
        GMPOTrainer(model=qwen2_model(TOKENIZER, seed=0), reward_funcs=successor_reward,
                    args=args, train_dataset=successor_dataset(), processing_class=TOKENIZER)  # fmt: skip


def test_a_variant_that_returns_the_loss_alone_trains_with_an_unknown_clip_fraction(tmp_path):
    """(CHANGELOG, Unreleased): was ``TypeError: ... must return (loss, clipped fraction)``."""
    trainer = make_trainer(tmp_path, loss_variant="tests.trl.test_loss_variant:no_fraction")
    default = make_trainer(tmp_path)
    inputs = inputs_of(default, {"drift": 0.5})
    loss, grad = loss_and_grad(trainer, inputs)
    want, want_grad = loss_and_grad(default, inputs)
    assert_same(loss, want)
    assert_same(grad, want_grad)
    got = last_metrics(trainer)
    assert got["variant/clip_ratio"] != got["variant/clip_ratio"]  # NaN: unknown
    assert got["log_ratio/max"] == pytest.approx(last_metrics(default)["log_ratio/max"], rel=1e-6)


def test_a_result_of_another_shape_names_the_signature(tmp_path):
    trainer = make_trainer(tmp_path, loss_variant="tests.trl.test_loss_variant:per_row")
    with pytest.raises(TypeError, match=r"must be loss\(logp, old_logp, advantages, mask\) -> "):
        loss_and_grad(trainer, make_inputs(trainer, drift=0.5))


def test_clip_bounds_and_help(tmp_path):
    from gmpo_tasks.successor import toy_args
    from gmpo_trl.cli.help import short_help
    from gmpo_trl.cli.plots import log_clip_range

    def bounds(name):
        return log_clip_range(GMPOConfig(**toy_args(str(tmp_path), loss_variant=name)))

    assert bounds("gmpo_narrow") == (-0.2, 0.2)
    assert bounds("gmpo_noclip") is None
    assert log_clip_range(GMPOConfig(**toy_args(str(tmp_path)))) == (-0.4, 0.4)
    for command in ("train", "compare"):
        text = " ".join(short_help(command).split())
        assert "--loss_variant X A loss variant in place of gmpo_core's loss" in text
        assert "Also --variant." in text


def test_compare_variant_end_to_end(tmp_path, capsys):
    """``gmpo compare --variant gmpo_narrow`` on the toy task: GRPO as always, the GMPO side
    trained with the variant; the report names it by name and label."""
    from gmpo_trl.cli import main
    from gmpo_trl.cli.reports import read_metrics

    label = VARIANTS["gmpo_narrow"].label
    argv = ["compare", "--variant", "gmpo_narrow", "--output_dir", str(tmp_path),
            "--max_steps", "2"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["variant"] == "gmpo_narrow"
    assert f"GMPO: loss variant 'gmpo_narrow' ({label})" in summary["settings"]
    assert f"({label})" in (tmp_path / "summary.md").read_text()
    gmpo_rows = read_metrics(tmp_path / "gmpo" / "seed0" / "metrics.jsonl")
    grpo_rows = read_metrics(tmp_path / "grpo" / "seed0" / "metrics.jsonl")
    assert len(gmpo_rows) == len(grpo_rows) == 2
    assert all("variant/clip_ratio" in r and "clip_ratio/region_mean" not in r for r in gmpo_rows)
    assert not any("variant/clip_ratio" in r for r in grpo_rows)
    assert summary["runs"]["GMPO"][0]["variant_clip_ratio_max"] >= 0
    assert "variant_clip_ratio_max" not in summary["runs"]["GRPO"][0]
    out = capsys.readouterr().out
    assert "gmpo compare (GMPO variant gmpo_narrow, seed 0)" in out
    assert "max clipped fraction (variant)" in out


# Regression (CHANGELOG, Unreleased): a loss variant whose module raises at import or does not
# parse, or a YAML value that is not a name, ended in a 37-line traceback and exit 1.
@pytest.mark.parametrize(
    ("command", "source", "message"),
    [
        ("train", "raise RuntimeError('boom')\n",
         "variant 'cli_variant_mod:fn': importing 'cli_variant_mod' failed: RuntimeError: boom"),
        ("compare", "def fn(:\n",
         "variant 'cli_variant_mod:fn': importing 'cli_variant_mod' failed: SyntaxError: "),
    ],
)  # fmt: skip
def test_a_variant_module_that_fails_is_one_line_exit_2(tmp_path, command, source, message):
    from tests._user_code import run_with_modules

    option = "--loss_variant" if command == "train" else "--variant"
    argv = ["-m", "gmpo_trl.cli", command, option, "cli_variant_mod:fn", "--output_dir",
            str(tmp_path / "out")]  # fmt: skip
    proc = run_with_modules(argv, tmp_path, {"cli_variant_mod": source})
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith(f"gmpo {command}: error: loss_variant: ") and message in err[0]
    assert not (tmp_path / "out").exists()


def test_a_yaml_loss_variant_that_is_not_a_name_is_one_line(tmp_path, capsys):
    from gmpo_trl.cli import main

    config = tmp_path / "run.yaml"
    config.write_text("loss_variant: 5\n")
    argv = ["train", "--config", str(config), "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gmpo train: error: loss_variant: a variant is a name or module:function, got int 5"
    ]
