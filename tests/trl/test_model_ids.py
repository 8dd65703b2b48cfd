"""``--model`` that names no local directory is read as a hub id; where it can be told up front
that no hub will give it (offline, the hub unreachable or without that model), one line says
that no local directory of that name was found, in seconds, without the hub client's five
retries (about 25 s). A hub id in the hub cache, or the name of a packaged model, needs no
network."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("huggingface_hub")

from huggingface_hub import HfApi, constants  # noqa: E402
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError  # noqa: E402

from gmpo_trl.cli.checks import check_model  # noqa: E402
from gmpo_trl.cli.errors import CLIError  # noqa: E402

#: a port nothing listens on: the connection is refused at once
CLOSED = "http://127.0.0.1:9"


@pytest.fixture
def hub(monkeypatch, tmp_path: Path) -> Path:
    """An empty hub cache under tmp_path, the hub at a closed port, online; the cwd tmp_path."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hub"


def answer(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", CLOSED))


def no_network(monkeypatch) -> None:
    def refused(*a, **k):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(HfApi, "model_info", refused)


@pytest.mark.parametrize("folder", [True, False], ids=["models-exists", "no-models-folder"])
def test_a_relative_path_that_is_not_there_is_one_line_at_once(hub, tmp_path, folder) -> None:
    if folder:
        (tmp_path / "models").mkdir()
    start = time.monotonic()
    with pytest.raises(CLIError) as err:
        check_model("models/nope")
    assert time.monotonic() - start < 5  # the hub client's retries took about 25 s
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--model 'models/nope': no local directory 'models/nope' was found")
    assert f"the hub ({CLOSED}) cannot be reached" in message
    assert "a hub id needs the network or a copy in the hub cache" in message


def test_offline_the_hub_is_not_asked(hub, monkeypatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    no_network(monkeypatch)
    with pytest.raises(CLIError, match=r"no local directory 'org/name' was found, and it is not "
                       r"in the hub cache \(offline: HF_HUB_OFFLINE\)"):  # fmt: skip
        check_model("org/name")


def test_a_hub_id_the_hub_does_not_have(hub, monkeypatch) -> None:
    def missing(*a, **k):
        raise RepositoryNotFoundError("404", response=answer(404))

    monkeypatch.setattr(HfApi, "model_info", missing)
    with pytest.raises(CLIError, match="no local directory 'org/name' was found, and the hub "
                       f"\\({CLOSED}\\) has no model 'org/name'"):  # fmt: skip
        check_model("org/name")


def test_a_gated_hub_id_is_the_loaders_to_judge(hub, monkeypatch) -> None:
    def gated(*a, **k):
        raise GatedRepoError("403", response=answer(403))

    monkeypatch.setattr(HfApi, "model_info", gated)
    check_model("org/gated")


def test_a_cached_hub_id_needs_no_network(hub, monkeypatch) -> None:
    """As transformers resolves it offline: the hub cache's snapshot of refs/main."""
    repo = hub / "models--org--name"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    for offline in (False, True):
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        no_network(monkeypatch)
        check_model("org/name")


def test_a_packaged_models_name_needs_no_network(hub, monkeypatch) -> None:
    no_network(monkeypatch)
    check_model("smollm2-135m")
