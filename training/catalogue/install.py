"""Installing a pair into MODEL_DIR, and what is installed there.

An install holds a lock per pair (a second install of it waits, then finds it there), builds
the bundle in a hidden directory of MODEL_DIR, translates a probe sentence with the service's
own ``Translator``, and only then renames the directory to the pair's name: a failed or
interrupted install leaves no bundle, only a hidden directory the next install clears.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from training.catalogue import CatalogueError, argos, opus, parse_pair

Source = Literal["argos", "opus-mt", "auto"]
# Beside the manifest: where the bundle came from (``translate-models list`` reads it).
ORIGIN = "installed.json"
PROBE = "This is a short test."
PARTIAL = ".installing-"


def default_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "translate-models"


@dataclass(frozen=True)
class Installed:
    pair: str
    source: str
    version: str
    size: int  # bytes on disk
    path: Path


def _size(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def installed(model_dir: Path) -> list[Installed]:
    """The bundles in ``model_dir``, whether this command installed them or not."""
    from service.bundle import discover_bundles

    found = []
    for path in discover_bundles(model_dir):
        origin = {}
        if (path / ORIGIN).is_file():
            origin = json.loads((path / ORIGIN).read_text(encoding="utf-8"))
        found.append(Installed(path.name, origin.get("source", "local"),
                               origin.get("version", "-"), _size(path), path))
    return found


def remove(model_dir: Path, pair: str) -> Path:
    """Delete the bundle of ``pair``: renamed away first, so that a service listing MODEL_DIR
    never sees half of it."""
    path = model_dir / pair
    if not (path / "manifest.json").is_file():
        raise CatalogueError(f"{pair}: not installed in {model_dir}")
    with _locked(model_dir, pair):
        doomed = model_dir / f".removing-{pair}-{os.getpid()}"
        path.rename(doomed)
        shutil.rmtree(doomed)
    return path


@contextmanager
def _locked(model_dir: Path, pair: str) -> Iterator[None]:
    locks = model_dir / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{pair}.lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{pair}: another install of it is running; waiting for it",
                  file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(pair: str, source: Source, cache_dir: Path, index: str | None,
              ) -> tuple[Path, str, dict[str, str], str, dict[str, Any]]:
    """(the model's files, where from, its version and address, the bundle's name, what the
    import is told: the pair's languages and target-language token of an Opus-MT model
    installed by pair)."""
    if source in ("argos", "auto"):
        try:
            package = argos.newest(argos.read_index(index), pair)
        except CatalogueError as error:
            if source == "argos":
                raise CatalogueError(f"{pair}: {error}") from error
            print(f"{pair}: {error}; trying Opus-MT", file=sys.stderr, flush=True)
            package = None  # auto: the index unreachable, Opus-MT may still have it
        if package is not None:
            path = argos.fetch(package, cache_dir)
            return path, "argos", {"version": package.package_version,
                                   "url": package.links[0]}, pair, {}
        if source == "argos":
            raise CatalogueError(f"{pair}: not in the Argos index "
                                 f"{index or argos.index_location()}")
    model = opus.for_pair(pair) if "/" in pair else opus.resolve(pair)
    path, commit = opus.fetch(model)
    origin = {"version": commit[:12], "url": f"{model.repo}@{commit}"}
    if model.source is None or model.target is None:  # a repository by its id: all of it
        return path, "opus-mt", origin, model.name, {}
    # By pair: that pair alone, under its codes, its sources prefixed with the target's token
    # where the model has such tokens (>>spa<< for es in opus-mt-en-mul).
    try:
        token = opus.target_token(path, model.target)
    except CatalogueError as error:
        raise CatalogueError(f"{pair}: {model.repo}: {error}") from error
    if token:
        origin["language_token"] = token
    return path, "opus-mt", origin, model.name, {
        "source_lang": model.source, "target_lang": model.target,
        "target_languages": {model.target: token} if token else {}}


def probe(bundle: Path) -> str:
    """A sentence translated by the service's ``Translator`` over the new bundle alone: a
    model that loads but cannot translate is refused before it is installed."""
    from service.bundle import load_bundle
    from service.translator import Translator

    source, target = load_bundle(bundle).pairs[0]
    pair = (source.lower(), target.lower())
    with Translator.open(bundle, models=[], threads=1, workers=1, cache_mb=0) as translator:
        text = translator.translate_batch([PROBE], pair=pair)[0].text
    if not text.strip():
        raise CatalogueError(f"{bundle.name}: the probe sentence {PROBE!r} translated to "
                             "nothing")
    return text


def install(pair: str, model_dir: Path, source: Source = "auto", *,
            cache_dir: Path | None = None, index: str | None = None) -> Installed:
    """``pair`` downloaded (or taken from the cache), imported with int8 graphs (as served),
    probed, and moved into ``model_dir``; an installed pair is left as it is."""
    from training.importers import UnsupportedModel, import_model

    if "/" not in pair:
        parse_pair(pair)
    cache_dir = cache_dir or default_cache_dir()
    model_dir.mkdir(parents=True, exist_ok=True)
    name = opus.for_pair(pair).name if "/" in pair else pair
    with _locked(model_dir, name):
        if (model_dir / name / "manifest.json").is_file():
            return next(found for found in installed(model_dir) if found.pair == name)
        # An interrupted install's directory, and the export's own temporary one beside it.
        for stale in [*model_dir.glob(f"{PARTIAL}{name}-*"),
                      *model_dir.glob(f".{PARTIAL}{name}-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        files, source_name, origin, name, languages = _download(pair, source, cache_dir, index)
        downloaded = time.monotonic()
        partial = model_dir / f"{PARTIAL}{name}-{os.getpid()}"
        try:
            import_model(files, partial, int8=True, **languages)
            imported = time.monotonic()
            translation = probe(partial)
            (partial / ORIGIN).write_text(json.dumps(
                {"source": source_name, "pair": name, **origin,
                 "probe": {"source": PROBE, "translation": translation},
                 "seconds": {"download": round(downloaded - started, 2),
                             "import": round(imported - downloaded, 2),
                             "probe": round(time.monotonic() - imported, 2)}},
                ensure_ascii=False, indent=1), encoding="utf-8")
            partial.rename(model_dir / name)
        except UnsupportedModel as error:
            raise CatalogueError(f"{name}: {origin['url']}: cannot be imported: "
                                 f"{' '.join(str(error).split())}") from error
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return next(found for found in installed(model_dir) if found.pair == name)
