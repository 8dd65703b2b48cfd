"""gmpo_variants: the loss variants, each registered once.

A variant is a policy loss with GMPO's inputs (:mod:`gmpo_variants.registry`: ``Variant``,
``register``, ``VARIANTS``, ``resolve``). Every module of this package registers its own on
import, so a new variant is one new file here:

- :mod:`gmpo_variants.gmpo`: ``gmpo`` (``gmpo_core.gmpo_loss``, ε 0.4), ``gmpo_narrow`` (0.2);
- :mod:`gmpo_variants.ablations`: the paper's ablations, ``gmpo_noclip`` and ``gmpo_seqclip``;
- :mod:`gmpo_variants.grpo`: ``grpo`` and ``grpo_wide``, TRL's ``loss_type="grpo"``;
- :mod:`gmpo_variants.hosts`: ``dapo``, ``gspo``, ``cispo`` and ``sapo``, verl's own losses
  (they need verl: ``pip install -e '.[verl]'`` in the clone);
- :mod:`gmpo_variants.trl_defaults`: ``dapo_trl`` and ``cispo_trl``, TRL's ``loss_type="dapo"``
  at its defaults and ``"cispo"`` at its documented cap (docs/regime_plan.md);
- :mod:`gmpo_variants.recipes`: the helpers docs/recipes.md starts from.

The stability study (``--methods``), ``gmpo compare --variant``, ``GMPOConfig.loss_variant``,
the reference tests and docs/recipes.md read :data:`VARIANTS`.
"""

from gmpo_variants.registry import VARIANTS, LossFn, Variant, register, resolve

__all__ = ["VARIANTS", "LossFn", "Variant", "register", "resolve"]
