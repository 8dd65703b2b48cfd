"""GMPOConfig: defaults, refusals, the field table, the TRL fingerprint and the version warning."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import warnings

import pytest

trl = pytest.importorskip("trl")

from gmpo_trl import GMPOConfig, GMPOTrainer, fields  # noqa: E402
from gmpo_trl.trainer import compute_loss_fingerprint  # noqa: E402
from tests.trl._support import GRPOConfig, make_trainer  # noqa: E402

pytestmark = pytest.mark.trl


def config(tmp_path, **kwargs):
    return GMPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **kwargs)


def test_defaults(tmp_path):
    args = config(tmp_path)
    assert args.epsilon == 0.4 and args.epsilon_high is None
    assert args.loss_type == "gmpo" and args.importance_sampling_level == "token"
    assert args.use_bias_correction_kl is False and args.delta is None
    assert isinstance(args, GRPOConfig)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss_type": "dapo"}, r"loss_type='dapo' has no meaning for GMPO.*docs/recipes.md"),
        ({"loss_type": "grpo"}, r"loss_type='grpo'.*docs/recipes.md"),
        (
            {"importance_sampling_level": "sequence"},
            r"importance_sampling_level='sequence'.*sequence_clip_loss.*docs/recipes.md",
        ),
        ({"use_bias_correction_kl": True}, r"use_bias_correction_kl=True is not supported"),
        ({"sapo_temperature_neg": 2.0}, r"sapo_temperature_neg=2.0 only applies"),
        ({"vespo_k_pos": 1.0}, r"vespo_k_pos=1.0 only applies"),
        ({"epsilon": 0.0}, r"epsilon must be a finite number > 0 \(a log-space bound\), got 0.0"),
        ({"epsilon_high": float("inf")}, r"epsilon_high must be"),
        ({"delta": 1.0}, r"delta must be a finite number > 1 .*got 1.0"),
        ({"gmpo_impl": "fast"}, r"gmpo_impl must be 'plain' \(the default\) or 'compiled', got"),
    ],
)
def test_refusals(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        config(tmp_path, **kwargs)


def test_honoured_values_are_accepted(tmp_path):
    args = config(tmp_path, epsilon=0.2, epsilon_high=0.3, delta=3.0, beta=0.01, gmpo_impl="plain")
    assert (args.epsilon, args.epsilon_high, args.delta) == (0.2, 0.3, 3.0)


def test_fields_changed_after_construction_are_checked_by_the_trainer(tmp_path):
    args = config(tmp_path)
    args.loss_type = "bnpo"
    with pytest.raises(ValueError, match="loss_type='bnpo'"):
        GMPOTrainer(model=None, reward_funcs=None, args=args)


def test_construction_smoke(tmp_path):
    trainer = make_trainer(tmp_path)
    assert isinstance(trainer.args, GMPOConfig) and trainer.epsilon_low == 0.4


def test_a_plain_grpo_config_is_refused(tmp_path):
    from trl.experimental.gmpo import GMPOConfig as TrlGMPOConfig

    args = TrlGMPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(TypeError, match=r"gmpo_trl.GMPOConfig"):
        GMPOTrainer(model=None, reward_funcs=None, args=args)


# --------------------------------------------------------------------------------------------
# the field table
# --------------------------------------------------------------------------------------------


def test_every_grpo_config_field_is_in_the_table():
    installed = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    unknown = sorted(installed - set(fields.FIELDS))
    assert not unknown, f"GRPOConfig fields missing from gmpo_trl.fields.FIELDS: {unknown}"
    stale = sorted(set(fields.FIELDS) - installed)
    assert not stale, f"fields in gmpo_trl.fields.FIELDS that GRPOConfig no longer has: {stale}"


def test_table_tags_and_gmpo_fields():
    assert {tag for tag, _ in fields.FIELDS.values()} == {"honoured", "rejected", "irrelevant"}
    assert all(note for _, note in fields.FIELDS.values())
    ours = {f.name for f in dataclasses.fields(GMPOConfig)} - {
        f.name for f in dataclasses.fields(trl.GRPOConfig)
    }
    assert ours == {name for name, option in fields.OPTIONS.items() if option.added}


def test_gmpo_options_come_from_the_option_table():
    """GMPOConfig declares exactly the options of ``fields.OPTIONS``, with their defaults and
    help; GMPOConfig redeclares the GRPOConfig fields of the table that are not ``added``."""
    declared = {f.name: f for f in dataclasses.fields(GMPOConfig)}
    grpo = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    for name, option in fields.OPTIONS.items():
        assert (declared[name].default, declared[name].metadata["help"]) == (
            option.default,
            option.help,
        ), name
        assert (name not in grpo) == option.added, name
        if not option.added:  # a GRPOConfig field with GMPO's own default or help
            assert (grpo[name].default, grpo[name].metadata.get("help")) != (
                option.default,
                option.help,
            ), name
    redeclared = {n for n in grpo if declared[n] is not grpo[n]}  # inherited: the same Field
    assert redeclared == {n for n, o in fields.OPTIONS.items() if not o.added}


def test_every_rejected_field_is_refused(tmp_path):
    """Each field tagged rejected has a value GMPOConfig refuses (the table does not lie)."""
    bad = {
        "loss_type": "dapo",
        "importance_sampling_level": "sequence",
        "use_bias_correction_kl": True,
        "sapo_temperature_neg": 2.0,
        "sapo_temperature_pos": 2.0,
        "vespo_k_pos": 1.0,
        "vespo_lambda_pos": 1.0,
        "vespo_k_neg": 1.0,
        "vespo_lambda_neg": 1.0,
    }
    rejected = {name for name, (tag, _) in fields.FIELDS.items() if tag == "rejected"}
    assert rejected == set(bad)
    for name, value in bad.items():
        with pytest.raises(ValueError, match=name):
            config(tmp_path, **{name: value})


def test_grpo_compute_loss_fingerprint():
    """Fails when TRL's GRPOTrainer._compute_loss changes: review gmpo_trl.trainer and
    gmpo_trl.fields against the new source, then update fields.COMPUTE_LOSS_SHA256."""
    assert compute_loss_fingerprint() == fields.COMPUTE_LOSS_SHA256


def test_markdown_table_lists_every_field_and_the_docs_show_it():
    from pathlib import Path

    table = fields.markdown_table()
    assert all(f"`{name}`" in table for name in fields.FIELDS)
    docs = Path(__file__).resolve().parents[2] / "docs" / "trl.md"
    assert table in docs.read_text(), "docs/trl.md: paste gmpo_trl.fields.markdown_table() again"


# --------------------------------------------------------------------------------------------
# version warning
# --------------------------------------------------------------------------------------------


def _installed_trl(monkeypatch, version):
    """gmpo_trl reads trl's version from the package metadata (importing trl is slow)."""
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: version if name == "trl" else real(name)
    )


def test_untested_trl_version_warns_once_in_one_line(monkeypatch):
    import gmpo_trl

    _installed_trl(monkeypatch, "1.17.0")
    with pytest.warns(
        UserWarning, match=r"tested with trl 1\.16\.x; trl 1\.17\.0 is installed"
    ) as w:
        importlib.reload(gmpo_trl)
    assert len(w) == 1 and "\n" not in str(w[0].message)


def test_tested_trl_version_does_not_warn(monkeypatch):
    import gmpo_trl

    _installed_trl(monkeypatch, "1.16.3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(gmpo_trl)
