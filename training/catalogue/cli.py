"""``translate-models``: what can be installed, install, list, remove.

    translate-models available [--source argos|opus-mt]
    translate-models install en-fr fr-en [--source argos|opus-mt|auto]
    translate-models list [--service http://localhost:8000] [--api-key KEY]
    translate-models remove en-fr

MODEL_DIR (or ``--model-dir``) is where bundles go, as the service reads it; ARGOS_PACKAGE_INDEX
names Argos' index (a URL or a file), HF_ENDPOINT / HF_HUB_OFFLINE / HF_HOME the hub's. Every
failure is one line on stderr naming the pair, the URL and the cause, and exit status 1.
``list`` asks the service at ``--service`` (TRANSLATE_SERVICE_URL; default: this machine's
PORT) which bundles it has loaded, from its ``/metrics``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from training.catalogue import CatalogueError


def _model_dir(value: str | None) -> Path:
    if value:
        return Path(value)
    if os.environ.get("MODEL_DIR"):
        return Path(os.environ["MODEL_DIR"])
    from service.settings import DEFAULT_MODEL_DIR

    return DEFAULT_MODEL_DIR


# Long enough for a busy service's /metrics, short enough for a command typed by hand.
SERVICE_TIMEOUT_S = 3.0


def _service_url(value: str | None) -> str:
    if value:
        return value.rstrip("/")
    if os.environ.get("TRANSLATE_SERVICE_URL"):
        return os.environ["TRANSLATE_SERVICE_URL"].rstrip("/")
    return f"http://127.0.0.1:{os.environ.get('PORT') or 8000}"


def loaded_models(url: str, api_key: str | None = None) -> dict[str, bool]:
    """{bundle directory: loaded} as the service at ``url`` reports it (its
    ``translate_model_loaded`` metric); a ``CatalogueError`` saying why when it cannot tell."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"{url}/metrics")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=SERVICE_TIMEOUT_S) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        hint = " (give --api-key)" if error.code in (401, 403) else ""
        raise CatalogueError(f"the service at {url} answers /metrics with HTTP {error.code}"
                             f"{hint}: loaded or not unknown") from None
    except (OSError, ValueError) as error:  # refused, timed out, not a URL
        reason = getattr(error, "reason", error)
        raise CatalogueError(f"no service answers at {url} ({reason}): loaded or not "
                             "unknown") from None
    try:
        loaded = {sample.labels["model"]: sample.value > 0
                  for family in text_string_to_metric_families(text)
                  if family.name == "translate_model_loaded"
                  for sample in family.samples if "model" in sample.labels}
    except ValueError as error:
        raise CatalogueError(f"{url}/metrics is not Prometheus' text format ({error})") from None
    if not loaded:
        raise CatalogueError(f"the service at {url} reports no translate_model_loaded metric "
                             "(an older version?): loaded or not unknown")
    return loaded


def _list(model_dir: Path, service: str, api_key: str | None) -> None:
    from training.catalogue.install import installed

    found = installed(model_dir)
    try:
        loaded: dict[str, bool] | None = loaded_models(service, api_key)
    except CatalogueError as error:
        print(f"translate-models: {error}", file=sys.stderr)
        loaded = None
    for bundle in found:
        if loaded is None:
            state = "-"
        elif bundle.pair in loaded:
            state = "loaded" if loaded[bundle.pair] else "not loaded"
        else:  # another MODEL_DIR, or MODELS leaves it out
            state = "not served"
        print(f"{bundle.pair}\t{bundle.source}\t{bundle.version}\t{_megabytes(bundle.size)}\t"
              f"{state}\t{bundle.path}")


def _megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:.1f} MB"


def _available(source: str | None) -> None:
    from training.catalogue import argos, opus

    if source in (None, "argos"):
        for package in sorted(argos.read_index(), key=lambda p: (p.pair, p.version_key)):
            print(f"{package.pair}\targos\t{package.package_version}\t"
                  f"{_megabytes(package.size)}")
    if source in (None, "opus-mt"):
        for repo in opus.available():
            print(f"{opus.for_pair(repo).name}\topus-mt\t{repo}\t-")


def _install(pairs: Sequence[str], model_dir: Path, source: str, cache_dir: Path | None,
             ) -> int:
    try:
        import torch  # noqa: F401  (the importers need it; say so before downloading)
    except ImportError:
        raise CatalogueError("install imports models with torch, which is not installed "
                             "here: pip install '.[train]' (the serving image has no torch; "
                             "install into MODEL_DIR's volume from an image or machine "
                             "that has it, see docs/models.md)") from None
    from training.catalogue.install import install

    failed = 0
    for pair in pairs:
        started = time.monotonic()
        try:
            done = install(pair, model_dir, source, cache_dir=cache_dir)  # type: ignore[arg-type]
        except CatalogueError as error:
            print(f"translate-models: {error}", file=sys.stderr)
            failed += 1
            continue
        print(f"{done.pair}\t{done.source}\t{done.version}\t{_megabytes(done.size)}\t"
              f"{time.monotonic() - started:.1f} s\t{done.path}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="translate-models", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", help="where bundles go (default: MODEL_DIR, as served)")
    commands = parser.add_subparsers(dest="command", required=True)
    available = commands.add_parser("available", help="what can be installed")
    available.add_argument("--source", choices=("argos", "opus-mt"))
    install = commands.add_parser("install", help="download, import, probe, install")
    install.add_argument("pairs", nargs="+", metavar="PAIR",
                         help="e.g. en-fr, or an Opus-MT repository: "
                         "Helsinki-NLP/opus-mt-en-ROMANCE")
    install.add_argument("--source", choices=("argos", "opus-mt", "auto"), default="auto",
                         help="auto: Argos' package where its index has one, else Opus-MT")
    install.add_argument("--cache-dir", type=Path,
                         help="downloads of Argos packages (default: "
                         "$XDG_CACHE_HOME/translate-models); Opus-MT uses the hub's cache")
    listing = commands.add_parser("list", help="installed bundles, and whether the service "
                                  "has each loaded")
    listing.add_argument("--service", help="the service's URL (default: "
                         "TRANSLATE_SERVICE_URL, else http://127.0.0.1:$PORT, PORT 8000)")
    listing.add_argument("--api-key", default=os.environ.get("TRANSLATE_API_KEY"),
                         help="a key, when the service's /metrics needs one (default: "
                         "TRANSLATE_API_KEY)")
    remove = commands.add_parser("remove", help="delete an installed bundle")
    remove.add_argument("pair", metavar="PAIR")
    args = parser.parse_args(argv)
    model_dir = _model_dir(args.model_dir)
    try:
        if args.command == "available":
            _available(args.source)
        elif args.command == "install":
            return _install(args.pairs, model_dir, args.source, args.cache_dir)
        elif args.command == "list":
            _list(model_dir, _service_url(args.service), args.api_key)
        else:
            from training.catalogue.install import remove as remove_pair

            print(f"removed {remove_pair(model_dir, args.pair)}")
    except CatalogueError as error:
        print(f"translate-models: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
