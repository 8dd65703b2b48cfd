"""The model a run trains, checked before any work: ``--model`` or a chat task's own pretrained
model (a packaged model's name resolved to its directory: ``gmpo_tasks.pretrained``), a chat
template where a chat task's prompts need one, and ``--format_reward`` (a chat task's)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gmpo_tasks.catalog import TASKS
from gmpo_tasks.task import Task
from gmpo_trl.cli.errors import CLIError


def resolve_model(script: Any, task: Task) -> str | None:
    """The model a run trains: ``--model``, else the task's own pretrained model (None: the
    task's tiny model). A packaged model's name (``gmpo_tasks.pretrained.MODELS``) resolves to
    its local directory, converted on first use; a chat task on the task's own prompts needs a
    model with a chat template."""
    from gmpo_tasks import pretrained

    spec = script.model if script.model is not None else task.model_name
    if spec is None:
        return None
    where = "--model" if script.model is not None else f"the {task.name} task's model"
    if spec in pretrained.MODELS:
        try:
            return pretrained.resolve(spec)
        except ValueError as err:
            raise CLIError(f"{where} {spec}: {err}") from err
    if task.model_name is not None and script.dataset is None:
        check_chat_template(spec, task)
    return str(spec)


def check_chat_template(spec: str, task: Task) -> None:
    """A local model directory that a chat task's prompts are rendered by holds a chat template
    (``chat_template.jinja``, or ``chat_template`` in ``tokenizer_config.json``); a hub id is
    the hub's to check."""
    import json

    path = Path(spec).expanduser()
    if not path.is_dir():
        return
    config = path / "tokenizer_config.json"
    found = (path / "chat_template.jinja").is_file() or (
        config.is_file() and "chat_template" in json.loads(config.read_text())
    )
    if not found:
        raise CLIError(
            f"--model {spec!r}: the {task.name} task's prompts are chat messages, and this model "
            "has no chat template; give a chat model, --dataset with plain prompts, or --task "
            "successor (the toy task)"
        )


def check_format_reward(task: Task, script: Any) -> Callable[..., Any]:
    """``--format_reward``: a chat task's format reward, on the task's own prompts."""
    fn = getattr(task, "format_reward", None)
    if fn is None or script.dataset is not None:
        chat = [name for name, t in TASKS.items() if getattr(t, "format_reward", None)]
        raise CLIError(
            "--format_reward is a chat task's answer format, on its own prompts: give --task "
            f"{' or '.join(chat)} without --dataset"
        )
    return fn  # type: ignore[no-any-return]


def check_hub_id(spec: str, accepted: str) -> None:
    """``--model spec`` names no local directory, so it is read as a hub id. Where it can be
    told up front that no hub will give it, one line says so at once (the hub client would
    retry five times over about 25 s, then not say that no local directory was found): offline
    (``HF_HUB_OFFLINE``) and not in the hub cache; the hub unreachable; the hub without it. A
    hub id in the hub cache (as transformers resolves it offline) and a packaged model's name
    ask no network; a gated or private model is the loader's to judge."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from gmpo_tasks import pretrained

    if spec in pretrained.MODELS:
        return
    try:
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return
    except ValueError:  # not a valid hub id (huggingface_hub's HFValidationError)
        raise CLIError(f"--model {spec!r}: no such directory; {accepted}") from None
    missing = f"--model {spec!r}: no local directory {spec!r} was found, and"
    needs = f"a hub id needs the network or a copy in the hub cache; {accepted}"
    if constants.HF_HUB_OFFLINE:
        raise CLIError(f"{missing} it is not in the hub cache (offline: HF_HUB_OFFLINE); {needs}")
    endpoint = constants.ENDPOINT
    unreachable: tuple[type[BaseException], ...] = (OSError,)  # requests' errors too
    with contextlib.suppress(ImportError):  # huggingface_hub >= 1 asks through httpx
        import httpx

        unreachable += (httpx.TransportError,)
    try:
        HfApi(endpoint=endpoint).model_info(spec, timeout=10)
    except GatedRepoError:
        return
    except RepositoryNotFoundError as err:
        raise CLIError(f"{missing} the hub ({endpoint}) has no model {spec!r} (a private one "
                       f"needs `hf auth login`); {accepted}") from err  # fmt: skip
    except unreachable as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CLIError(
            f"{missing} it is not in the hub cache, and the hub ({endpoint}) cannot be reached "
            f"({reason}); {needs}"
        ) from err
    except Exception:  # the hub answered otherwise (a server error): the loader will say
        return
