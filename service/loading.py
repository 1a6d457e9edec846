"""The bundles of MODEL_DIR (those MODELS names) loaded into engines, one per language pair."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from service.bundle import MANIFEST, discover_bundles
from service.engine import Engine
from service.settings import Settings

log = logging.getLogger("service")

Pair = tuple[str, str]
EngineFactory = Callable[[Path, Settings], Engine]


def pair_label(pair: Pair) -> str:
    return f"{pair[0]}-{pair[1]}"


def default_engine(bundle_dir: Path, settings: Settings) -> Engine:
    return Engine(
        bundle_dir,
        device=settings.device,
        threads=settings.threads,
        variant=settings.variant,
        workers=settings.workers,
        memory_arena=settings.memory_arena,
    )


def bundle_dirs(model_dir: Path, names: Sequence[str] = ()) -> list[Path]:
    """MODEL_DIR may be one bundle or a directory of bundles; ``names`` (MODELS) picks some of
    the latter, and one that is not there is an error, not a silent omission."""
    if (model_dir / MANIFEST).is_file():
        return [model_dir]
    found = discover_bundles(model_dir)
    if not names:
        return found
    missing = sorted(set(names) - {path.name for path in found})
    if missing:
        raise RuntimeError(f"MODELS names {', '.join(missing)}, which {model_dir} does not hold "
                           f"(it holds: {', '.join(p.name for p in found) or 'nothing'})")
    return [path for path in found if path.name in names]


def load_engines(settings: Settings, factory: EngineFactory = default_engine,
                 ) -> dict[Pair, Engine]:
    """An engine per (source, target) pair, lower-cased; raises when there is no bundle or two
    bundles serve the same pair."""
    directories = bundle_dirs(Path(settings.model_dir), settings.models)
    if not directories:
        raise RuntimeError(f"no model bundles in {settings.model_dir} (set MODEL_DIR)")
    engines: dict[Pair, Engine] = {}
    for directory in directories:
        engine = factory(directory, settings)
        # A multilingual bundle serves a pair per target language, from one set of sessions.
        for source, target in engine.bundle.pairs:
            pair = (source.lower(), target.lower())
            if pair in engines:
                other = engines[pair].bundle.dir
                raise RuntimeError(f"{directory} and {other} both serve {pair_label(pair)}")
            engines[pair] = engine
            device = getattr(engine, "device", settings.device)
            log.info("loaded %s from %s on %s", pair_label(pair), directory, device)
    return engines
