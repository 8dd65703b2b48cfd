"""GMPOConfig: defaults, refusals, the field table, the TRL fingerprint and the version warning."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

trl = pytest.importorskip("trl")

from gmpo_trl import (  # noqa: E402
    GMPOConfig,
    GMPOTrainer,
    compat,
    fields,
)
from gmpo_trl.compat import compute_loss_fingerprint  # noqa: E402
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
        # (CHANGELOG, 0.2): accepted, then trained silently (or failed at the first step)
        ({"beta": -0.5}, r"beta must be a finite number >= 0, got -0.5"),
        ({"beta": float("nan")}, r"beta must be a finite number >= 0, got nan"),
        ({"beta": float("inf")}, r"beta must be a finite number >= 0, got inf"),
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


def _declared_by_grpo_config() -> set[str]:
    """GRPOConfig's fields minus those it inherits unchanged from transformers' TrainingArguments
    (the same dataclass field object: neither redeclared nor given another default)."""
    from transformers import TrainingArguments

    inherited = TrainingArguments.__dataclass_fields__
    return {
        name
        for name, field in trl.GRPOConfig.__dataclass_fields__.items()
        if field._field_type is dataclasses._FIELD and inherited.get(name) is not field
    }


def test_every_grpo_config_field_is_in_the_table():
    """Fails on a field the installed GRPOConfig declares (or redeclares) and the table does not
    know; a field it inherits unchanged from TrainingArguments needs no entry (a new
    transformers release adds such fields, and they never reach the loss step)."""
    unknown = sorted(_declared_by_grpo_config() - set(fields.FIELDS))
    assert not unknown, f"GRPOConfig fields missing from gmpo_trl.fields.FIELDS: {unknown}"


def test_the_table_has_no_stale_loss_field():
    """Every honoured or rejected field of the table is a field of the installed GRPOConfig
    (at the newest tested TRL; older ones lack the fields added since, named in the skip)."""
    installed = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    loss_fields = {name for name, (tag, _) in fields.FIELDS.items() if tag != "irrelevant"}
    stale = sorted(loss_fields - installed)
    if stale and trl.__version__ != compat.TESTED_TRL[-1]:
        pytest.skip(f"trl {trl.__version__}'s GRPOConfig lacks {stale} (added after it)")
    assert not stale, f"fields in gmpo_trl.fields.FIELDS that GRPOConfig no longer has: {stale}"


def test_a_new_grpo_config_field_fails_the_table_and_a_training_argument_does_not():
    """The check above on two synthetic configs: a field GRPOConfig declares is reported, a
    TrainingArguments field it inherits is not."""
    from transformers import TrainingArguments

    @dataclasses.dataclass
    class NewTrainingArguments(TrainingArguments):
        brand_new_trainer_option: int = 0

    @dataclasses.dataclass
    class NewGRPOConfig(trl.GRPOConfig):
        brand_new_loss_option: float = 0.0

    for cls, expected in ((NewGRPOConfig, {"brand_new_loss_option"}), (trl.GRPOConfig, set())):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trl, "GRPOConfig", cls)
            assert _declared_by_grpo_config() - set(fields.FIELDS) == expected
    assert "brand_new_trainer_option" not in _declared_by_grpo_config()


def test_table_tags_and_gmpo_fields():
    assert {tag for tag, _ in fields.FIELDS.values()} == {"honoured", "rejected", "irrelevant"}
    assert all(note for _, note in fields.FIELDS.values())
    ours = {f.name for f in dataclasses.fields(GMPOConfig)} - {
        f.name for f in dataclasses.fields(trl.GRPOConfig)
    }
    assert ours == {name for name, option in fields.GMPO_FIELDS.items() if option.added}


def test_gmpo_options_come_from_the_option_table():
    """GMPOConfig declares exactly the options of ``fields.GMPO_FIELDS``, with their defaults and
    help; GMPOConfig redeclares the GRPOConfig fields of the table that are not ``added``."""
    declared = {f.name: f for f in dataclasses.fields(GMPOConfig)}
    grpo = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    for name, option in fields.GMPO_FIELDS.items():
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
    # and use_cpu, not a loss option: None (unset) until the CPU rule (gmpo_trl.device) decides
    assert redeclared == {n for n, o in fields.GMPO_FIELDS.items() if not o.added} | {"use_cpu"}
    assert declared["use_cpu"].default is None and grpo["use_cpu"].default is False


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
    """Fails when the installed TRL's GRPOTrainer._compute_loss is none of the reviewed sources:
    review gmpo_trl.trainer and gmpo_trl.fields against it, then add it to
    compat.KNOWN_COMPUTE_LOSS_SHA256."""
    known = compat.KNOWN_COMPUTE_LOSS_SHA256
    assert compute_loss_fingerprint() in known.values(), f"trl {trl.__version__} is not reviewed"
    if trl.__version__ in known:
        assert compute_loss_fingerprint() == known[trl.__version__]


def test_an_unknown_fingerprint_warns_and_a_known_one_does_not(tmp_path, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.check_compute_loss()
    monkeypatch.setattr(compat, "compute_loss_fingerprint", lambda: "0" * 64)
    with pytest.warns(UserWarning, match=r"_compute_loss of trl \S+ is not one gmpo_trl") as w:
        compat.check_compute_loss()
    assert len(w) == 1 and "1.10.0" in str(w[0].message) and "\n" not in str(w[0].message)


def test_markdown_table_lists_every_field_and_the_docs_show_it():
    from pathlib import Path

    table = fields.markdown_table()
    assert all(f"`{name}`" in table for name in fields.FIELDS)
    docs = Path(__file__).resolve().parents[2] / "docs" / "trl.md"
    assert table in docs.read_text(), "docs/trl.md: paste gmpo_trl.fields.markdown_table() again"


# --------------------------------------------------------------------------------------------
# version warning
# --------------------------------------------------------------------------------------------


def _reload_with_trl(monkeypatch, installed):  # type: ignore[no-untyped-def]
    import importlib.metadata

    import gmpo_trl

    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: installed if name == "trl" else real(name)
    )
    importlib.reload(gmpo_trl)


def test_an_unsupported_trl_version_warns_once_in_one_line(monkeypatch):
    with pytest.warns(
        UserWarning,
        match=r"supports trl >= 1\.10 \(tested with 1\.10\.0 and 1\.16\.0\); trl 1\.9\.2",
    ) as w:
        _reload_with_trl(monkeypatch, "1.9.2")
    assert len(w) == 1 and "\n" not in str(w[0].message)


@pytest.mark.parametrize("installed", ["1.10.0", "1.16.3", "1.17.0", "2.0.0.dev0"])
def test_a_supported_trl_version_does_not_warn(monkeypatch, installed):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _reload_with_trl(monkeypatch, installed)
