"""The pairs MODELS names that MODEL_DIR lacks, installed before the service reports ready
(INSTALL_MODELS=true, as LibreTranslate's ``--load-only`` installs what it names) or named with
the command that installs them.

Installing imports a model with torch, which the service never imports: the install runs as
``translate-models`` in a child process, whose lines go to the service's log.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from service.bundle import MANIFEST, discover_bundles
from service.settings import Settings

log = logging.getLogger("service")


def missing_pairs(settings: Settings) -> list[str]:
    """The names in MODELS with no bundle in MODEL_DIR (none when MODEL_DIR is one bundle)."""
    model_dir = Path(settings.model_dir)
    if not settings.models or (model_dir / MANIFEST).is_file():
        return []
    present = {path.name for path in discover_bundles(model_dir)}
    return [name for name in settings.models if name not in present]


def install_command(settings: Settings, pairs: list[str]) -> list[str]:
    return ["translate-models", "--model-dir", str(settings.model_dir), "install", *pairs]


def install_missing(settings: Settings) -> None:
    """Install what is missing, or raise with the command that would; returns once every
    pair of MODELS is in MODEL_DIR."""
    pairs = missing_pairs(settings)
    if not pairs:
        return
    command = install_command(settings, pairs)
    if not settings.install_models:
        raise RuntimeError(f"MODELS names {', '.join(pairs)}, which {settings.model_dir} does "
                           f"not hold: run `{' '.join(command)}` (or set INSTALL_MODELS=true)")
    log.info("installing %s into %s", ", ".join(pairs), settings.model_dir)
    child = subprocess.Popen([sys.executable, "-m", "training.catalogue.cli", *command[1:]],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    last = ""
    for line in child.stdout:
        if line.strip():
            last = line.strip()
            log.info("translate-models: %s", last)
    if child.wait() != 0:
        raise RuntimeError(f"INSTALL_MODELS: `{' '.join(command)}` failed: {last}")
    if still := missing_pairs(settings):
        raise RuntimeError(f"INSTALL_MODELS: {', '.join(still)} still missing after install")
