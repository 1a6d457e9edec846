"""The bundles of MODEL_DIR (those MODELS names), and how an engine is made of one
(``service.residency`` loads them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from service.bundle import MANIFEST, discover_bundles
from service.engine import Engine, auto_workers, available_cpus
from service.settings import Settings

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


def worker_count(settings: Settings) -> int:
    """The replicas each engine will have (``Engine``'s own rule), known before any is loaded:
    the scheduler starts its workers before the first model loads on a request."""
    threads = settings.threads or available_cpus()
    device = "cuda" if Engine._providers(settings.device)[0] == "CUDAExecutionProvider" else "cpu"
    return settings.workers or auto_workers(device, threads)


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
