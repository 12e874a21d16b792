"""Which model a name means: a named teacher, a registered model, a local directory or a hub id.

Kept apart from ``paths`` (where generated files live) because resolving a name
reaches up into the named teachers and the MLflow registry, and those need
``paths`` themselves: with resolution inside ``paths`` the three imported each
other.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from autocompress.errors import AutoCompressError
from autocompress.teachers import NAMED_TEACHERS, is_named, resolve_named
from autocompress.tracking import REGISTRY_PREFIX, registered_artifact


def resolve_model_dir(model: str | Path) -> Path:
    """Turn a model name, a path or a hub id into an existing local model directory.

    In order: a named teacher (``default``, ``smollm2-135m``; see
    ``autocompress.teachers``), a registered model (``models:/NAME/VERSION``, from
    the MLflow registry), an existing local path, then a hub id
    (``org/name``), downloaded into the Hugging Face cache where a network is
    allowed (not with ``HF_HUB_OFFLINE=1``).
    """
    text = str(model)
    if is_named(text):
        return resolve_named(text)
    if text.startswith(REGISTRY_PREFIX):
        return registered_artifact(text)
    path = Path(text).expanduser()
    if not path.exists() and looks_like_hub_id(text):
        path = download_from_hub(text)
    if not path.is_dir():
        raise AutoCompressError(
            f"model directory {path} does not exist",
            f"pass a directory made by save_pretrained, a hub id (org/name) or a named "
            f"teacher ({_named_list()})",
        )
    if not (path / "config.json").exists():
        raise AutoCompressError(
            f"{path} has no config.json, so it is not a Hugging Face model directory",
            f"pass a directory made by save_pretrained, or a named teacher ({_named_list()})",
        )
    return path


def _named_list() -> str:
    return ", ".join(NAMED_TEACHERS)


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_hub_id(text: str) -> bool:
    """``org/name`` with hub-legal characters (and not a relative path like ./x or ../x)."""
    return bool(_HUB_ID.match(text)) and not text.startswith(".")


# What a compression needs from a hub repository (not every format it may hold).
_HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
              "tokenizer*", "special_tokens_map.json", "*.model", "chat_template*", "*.txt"]


def download_from_hub(repo_id: str) -> Path:
    """A hub model's local snapshot (from the cache, or downloaded where a network exists)."""
    # lazy: huggingface_hub costs a second at import; only hub ids need it
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES,
                                      local_files_only=offline))
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise AutoCompressError(
            f"{repo_id} is not a local directory and is not in the Hugging Face cache, and {why}",
            "download it where a network exists (huggingface-cli download " + repo_id
            + "), pass a local directory, or use a named teacher (" + _named_list() + ")",
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        text = str(err).strip().splitlines()
        raise AutoCompressError(
            f"could not fetch {repo_id} from the Hugging Face hub: "
            f"{text[0] if text else type(err).__name__}",
            "check the id and your access (HF_TOKEN), or pass a local directory",
        ) from None
