"""Base models: a shipped model's name, a local folder, or a Hugging Face hub id.

`resolve_base_model` turns any of them into the local folder that vLLM and the trainer
load. A shipped name (`smollm2-135m-instruct`, bundled.py) is converted once into the
cache; a folder needs a `config.json`; a hub id (`Qwen/Qwen3-4B`, `org/name@rev`) is resolved
through `huggingface_hub` to a local snapshot folder (`<cache>/models--org--name/
snapshots/<commit>/`), and that folder is what vLLM and the trainer load, so both see the
same files and neither downloads anything itself. Resolution follows the hub library's
own conventions, read when the model is resolved (not when Python started):

- the cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`;
- offline: `HF_HUB_OFFLINE=1` (or `TRANSFORMERS_OFFLINE=1`) uses the cache only; online, a
  missing model is downloaded, and a hub that cannot be reached falls back to the cache;
- the revision: `org/name@rev` or `TrainableModel(revision=...)` — a branch, tag or commit
  (default `main`), looked up in the cache's `refs/` when offline;
- the token: `HF_TOKEN` (or the stored login), for gated and private models.

A hub id that cannot be resolved raises `ConfigError` naming the id, the revision, the
cache folder searched, whether `HF_HUB_OFFLINE` was on, and the fix.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rlcoach.errors import ConfigError
from rlcoach.models.bundled import BUNDLED_MODEL, SHIPPED_MODELS, shipped_model_path

__all__ = [
    "HubRef",
    "hub_cache_dir",
    "hub_offline",
    "parse_hub_id",
    "resolve_base_model",
    "resolve_hub_model",
    "served_base_name",
]

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<rev>[^\s@]+))?$"
)


@dataclass(frozen=True, slots=True)
class HubRef:
    """A model on the hub: its repository id and the revision asked for (None: `main`)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id


def parse_hub_id(base_model: str, revision: str | None = None) -> HubRef | None:
    """`org/name` or `org/name@rev` as a `HubRef`; None for anything else (a path, a name).

    `revision` (the `revision=` field) and an `@rev` suffix may both be given only if they
    agree."""
    match = _HUB_ID.match(base_model)
    if match is None or base_model.startswith((".", "/", "~")):
        return None
    suffix = match.group("rev")
    if suffix and revision and suffix != revision:
        raise ConfigError(
            f"base model {base_model!r} names revision {suffix!r} but revision={revision!r} "
            f"was also given; fix: give the revision once, either as "
            f"'{match.group('repo')}@<rev>' or as revision='<rev>'"
        )
    return HubRef(match.group("repo"), suffix or revision)


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """Whether the hub is off limits now (`HF_HUB_OFFLINE` or `TRANSFORMERS_OFFLINE`)."""
    return _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> Path:
    """The hub cache folder as `huggingface_hub` derives it, from today's environment."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    cache = (
        os.environ.get("HF_HUB_CACHE")
        or os.environ.get("HUGGINGFACE_HUB_CACHE")
        or os.path.join(os.path.expandvars(os.path.expanduser(home)), "hub")
    )
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def resolve_hub_model(ref: HubRef) -> Path:
    """The local snapshot folder of `ref`, from the cache (offline) or the hub."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = hub_cache_dir()
    offline = hub_offline()
    try:
        folder = snapshot_download(
            ref.repo_id,
            revision=ref.revision,
            cache_dir=cache,
            local_files_only=offline,
        )
    except GatedRepoError as e:
        raise ConfigError(
            f"base model {str(ref)!r} is a gated repository and this machine's token may not "
            "read it; fix: accept its terms on huggingface.co, then export HF_TOKEN=hf_... "
            "(or run `hf auth login`)"
        ) from e
    except RevisionNotFoundError as e:
        raise ConfigError(
            f"base model {ref.repo_id!r} has no revision {ref.revision!r} on the hub; fix: "
            "name an existing branch, tag or commit, e.g. "
            f"'{ref.repo_id}@main'"
        ) from e
    except RepositoryNotFoundError as e:
        raise ConfigError(
            f"base model {ref.repo_id!r} is not a model repository on the hub (or it is "
            "private and no token was found); fix: check the id, or export HF_TOKEN=hf_... "
            "for a private model, or pass a local model folder"
        ) from e
    except LocalEntryNotFoundError as e:
        raise _not_cached(ref, cache, offline) from e
    except (OSError, ValueError) as e:
        # A network failure with nothing cached surfaces here on some versions.
        raise _not_cached(ref, cache, offline, reason=str(e)) from e
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"base model {str(ref)!r} resolved to {str(path)!r}, which has no config.json "
            "(a partial download, or a repository that is not a transformers model); fix: "
            f"download it whole with `hf download {ref.repo_id}` or pass a local model folder"
        )
    logger.info("base model %s is %s", ref, path)
    return path


def _not_cached(ref: HubRef, cache: Path, offline: bool, reason: str = "") -> ConfigError:
    folder = cache / ("models--" + ref.repo_id.replace("/", "--"))
    revision = ref.revision or "main"
    if offline:
        why = "HF_HUB_OFFLINE is set, so only the cache was searched"
        fix = (
            f"download it on a machine with network access (`hf download {ref.repo_id}"
            f"{' --revision ' + ref.revision if ref.revision else ''}`) into this cache "
            "(or point HF_HOME / HF_HUB_CACHE at a cache that has it), or unset "
            "HF_HUB_OFFLINE to let rlcoach download it"
        )
    else:
        why = "the hub could not be reached and the cache does not have it"
        fix = (
            "check the network and HF_ENDPOINT, or point HF_HOME / HF_HUB_CACHE at a cache "
            f"that has it (`hf download {ref.repo_id}` fills one), or pass a local folder"
        )
    detail = f" ({reason})" if reason else ""
    return ConfigError(
        f"base model {ref.repo_id!r} (revision {revision!r}) is not in the hub cache "
        f"{str(folder)!r}: {why}{detail}; fix: {fix}"
    )


def resolve_base_model(base_model: str, revision: str | None = None) -> Path:
    """A local model folder for `base_model`: a shipped model's name, a folder with a
    `config.json`, or a Hugging Face hub id (`org/name`, `org/name@rev`) resolved to its
    snapshot in the hub cache (`resolve_hub_model`)."""
    if base_model in SHIPPED_MODELS and revision is None:
        return shipped_model_path(base_model)
    path = Path(base_model).expanduser()
    if (path / "config.json").is_file() and revision is None:
        return path
    ref = parse_hub_id(base_model, revision)
    if ref is not None:
        return resolve_hub_model(ref)
    raise ConfigError(
        f"base model {base_model!r} was not found: it is neither a shipped model "
        f"({', '.join(SHIPPED_MODELS)}; {BUNDLED_MODEL!r} is the default), nor a folder "
        "with a config.json, nor a hub id like 'Qwen/Qwen3-4B'; fix: pass a shipped "
        "model's name, a local model folder (e.g. one written by `save_pretrained`) or a "
        "Hugging Face hub id"
    )


def served_base_name(base_model: str) -> str:
    """The name the engine serves the base weights under: a shipped name or a hub id as
    given (without its revision), a folder's name."""
    if base_model in SHIPPED_MODELS:
        return base_model
    ref = parse_hub_id(base_model)
    if ref is not None and not Path(base_model).expanduser().exists():
        return ref.repo_id
    return Path(base_model).name
