"""Helsinki-NLP's Opus-MT models (MarianMT, ``Helsinki-NLP/opus-mt-{src}-{tgt}`` and the
multilingual ones such as ``opus-mt-en-ROMANCE``) through the ``huggingface_hub`` client, so
that ``HF_ENDPOINT`` (a mirror), ``HF_HUB_OFFLINE`` and its cache work as users know them.
The environment is read at each call, not when the hub's module is first imported."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from training.catalogue import CatalogueError

ORGANISATION = "Helsinki-NLP"
PREFIX = "opus-mt-"
# What the importer reads of a MarianMT repository (the weights as one of two files).
TOKENIZER_FILES = ("config.json", "source.spm", "target.spm", "vocab.json",
                   "target_vocab.json", "tokenizer_config.json")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class OpusModel:
    repo: str
    name: str  # the bundle's directory: en-de, en-ROMANCE


def for_pair(pair: str) -> OpusModel:
    """``en-de`` → Helsinki-NLP/opus-mt-en-de; a repository id names itself."""
    if "/" in pair:
        name = pair.rsplit("/", 1)[1]
        return OpusModel(pair, name.removeprefix(PREFIX))
    return OpusModel(f"{ORGANISATION}/{PREFIX}{pair}", pair)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None  # the hub's own default (~/.cache/huggingface/hub)


def _url(model: OpusModel) -> str:
    return f"{_endpoint() or 'https://huggingface.co'}/{model.repo}"


def _hub():
    """The hub's client, which the train extra brings (the serving image has none)."""
    try:
        import huggingface_hub
    except ImportError:
        raise CatalogueError("Opus-MT needs huggingface_hub, which is not installed here: "
                             "pip install '.[train]'") from None
    return huggingface_hub


def available() -> list[str]:
    """The Opus-MT repositories the hub lists."""
    api = _hub().HfApi(endpoint=_endpoint())
    try:
        found = api.list_models(author=ORGANISATION, search=PREFIX)
        return sorted(model.id for model in found)
    except Exception as error:  # the client's errors have no common base but Exception
        raise CatalogueError(f"{_endpoint() or 'https://huggingface.co'}: cannot list "
                             f"Opus-MT models ({_one_line(error)})") from error


def _one_line(error: BaseException) -> str:
    """The cause, without the layers of wrappers requests puts around a socket's error."""
    text = " ".join(str(error).split())
    socket_error = re.search(r"\[Errno -?\d+\] [^'\")(]+", text)
    return socket_error.group(0).strip() if socket_error else text or type(error).__name__


def _verify(model: OpusModel, path: Path, size: int | None, sha256: str | None) -> None:
    """The hub's own size and, for files in LFS, SHA-256; a file that fails leaves the cache
    (its blob), so that the next install downloads it again."""
    problem = None
    if size is not None and path.stat().st_size != size:
        problem = f"{path.stat().st_size} bytes, the hub says {size}"
    elif sha256 is not None:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while block := file.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != sha256:
            problem = f"SHA-256 {digest.hexdigest()[:12]}..., the hub says {sha256[:12]}..."
    if problem:
        path.resolve().unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise CatalogueError(f"{model.name}: {_url(model)}/{path.name}: corrupt download "
                             f"({problem})")


def fetch(model: OpusModel) -> tuple[Path, str]:
    """The repository's files the importer reads, in the hub's cache: (their directory, the
    commit). Offline, what the cache holds, or one line saying it holds nothing."""
    _hub()
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    if offline():
        try:
            path = Path(snapshot_download(model.repo, cache_dir=_cache_dir(),
                                          local_files_only=True,
                                          allow_patterns=[*TOKENIZER_FILES, *WEIGHTS]))
        except LocalEntryNotFoundError as error:
            raise CatalogueError(f"{model.name}: offline (HF_HUB_OFFLINE is set) and "
                                 f"{model.repo} is not in the hub's cache") from error
        return path, path.name
    api = HfApi(endpoint=_endpoint())
    try:
        info = api.model_info(model.repo, files_metadata=True)
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        raise CatalogueError(f"{model.name}: {_url(model)}: HTTP {status} (no such "
                             "Opus-MT model?)") from error
    except OSError as error:  # requests' connection errors are OSErrors
        raise CatalogueError(f"{model.name}: offline: cannot reach {_url(model)} "
                             f"({_one_line(error)})") from error
    siblings = {sibling.rfilename: sibling for sibling in info.siblings or []}
    weights = next((name for name in WEIGHTS if name in siblings), None)
    if weights is None:
        raise CatalogueError(f"{model.name}: {_url(model)}: neither model.safetensors nor "
                             "pytorch_model.bin (not a MarianMT repository?)")
    wanted = [name for name in TOKENIZER_FILES if name in siblings] + [weights]
    directory = None
    for name in wanted:
        sibling = siblings[name]
        if not sys.stderr.isatty():  # on a terminal the hub's client draws its own bars
            size = f", {sibling.size / 1e6:.1f} MB" if sibling.size else ""
            print(f"{model.name} (opus-mt): {model.repo}/{name}{size}", file=sys.stderr,
                  flush=True)
        try:
            # The default revision, not info.sha: the cache then records the commit as
            # main's, which an offline install later resolves.
            path = Path(hf_hub_download(model.repo, name, endpoint=_endpoint(),
                                        cache_dir=_cache_dir()))
        except Exception as error:  # connection, HTTP and consistency errors alike
            raise CatalogueError(f"{model.name}: {_url(model)}/{name}: "
                                 f"{_one_line(error)}") from error
        lfs = sibling.lfs
        _verify(model, path, sibling.size, lfs.sha256 if lfs else None)
        directory = path.parent
    assert directory is not None
    return directory, info.sha or directory.name
