"""Which bundles MODEL_DIR holds, which are loaded, and loading and unloading them.

Every bundle is served from the start, but its engine is loaded on the pair's first request
(``Residency.using``), in a thread so that requests for loaded pairs go on meanwhile; requests
that arrive while it loads wait for that one load. With MODEL_MEMORY_MB the loaded models stay
within the budget: before a model comes in, the least recently used ones that no request is
using are unloaded (their lanes leave the scheduler once empty). When every other model is in
use the new one comes in anyway, so the resident models exceed the budget by at most the one
loading, and the next load evicts again. PRELOAD names the models loaded at start (default:
every bundle when there is no budget).

A model counts against the budget as the resident memory its load added: the process's
``VmRSS`` before and after the engine opened, measured on a load during which no request ran
on another model (their allocations would count too: under traffic a 25 MiB model measured
87 MiB), and remembered for the bundle's later loads; never less than its graphs' size (memory
freed by an unload and reused shows as no growth). Until such a load, it counts as its graphs'
size (the encoder and decoder of the variant served, once per set of sessions the engine
opens, once more for an int8 engine's one-thread decoder) times ``ESTIMATE_FACTOR``.
docs/models.md has the figures.

A load that fails (a corrupt or unloadable bundle) answers its requests with
``ModelLoadFailed`` naming the pair and the cause; for ``LOAD_RETRY_S`` the pair's requests get
that answer at once, then the next one tries again (the bundle may have been reinstalled).
Other pairs are not affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from service.bundle import Bundle, load_bundle
from service.collector import collect_all
from service.engine import Engine
from service.loading import EngineFactory, Pair, bundle_dirs, pair_label
from service.metrics import Metrics
from service.scheduler.errors import ModelLoadFailed
from service.settings import Settings

if TYPE_CHECKING:
    from service.scheduler import Scheduler

log = logging.getLogger("service")

MB = 2**20
UNLOAD_WAIT_S = 60.0  # a lane's cancelled sentences leave at the worker's next step
UNLOAD_POLL_S = 0.01
# Resident memory a bundle's load adds over its graphs' size, for a bundle not loaded yet: the
# default en-de bundle (int8, 25.1 MiB of graphs, one worker) added 37.8 MiB as the process's
# first model and 27.7-27.9 MiB as its second and third (1.5x and 1.1x; docs/models.md).
ESTIMATE_FACTOR = 1.5
# How long a bundle that failed to load answers its requests with that failure before a
# request tries to load it again.
LOAD_RETRY_S = 30.0


def rss_megabytes() -> float | None:
    """This process's resident memory (``VmRSS``) in MiB; None where /proc has no statm."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / MB


def graph_megabytes(bundle: Bundle, variant: str | None) -> float:
    """The encoder and decoder graphs of ``variant`` (the manifest's default when None), in MB."""
    return sum(path.stat().st_size for path in bundle.graph_paths(variant)) / MB


def engine_megabytes(engine: Engine) -> float:
    """A loaded engine's graphs, in MiB, as many times as it holds them (see the module's
    notes): the least its load can have added."""
    encoder, decoder = engine.bundle.graph_paths(engine.variant)
    replicas = engine.replicas
    session_sets = len({id(replica.encoder) for replica in replicas})
    # An int8 engine's decoder for small steps is a second session only with several threads.
    small = len({id(replica.decoder_small) for replica in replicas
                 if replica.decoder_small is not replica.decoder})
    return (session_sets * encoder.stat().st_size
            + (session_sets + small) * decoder.stat().st_size) / MB


@dataclass
class Resident:
    engine: Engine
    megabytes: float


class Residency:
    """The bundles of ``settings.model_dir`` (those ``settings.models`` names) by the pairs
    they serve, loaded within ``settings.model_memory_mb`` (0: no budget). The Translator
    holds a pair's engine with ``using``; the scheduler gets the lanes of each model loaded
    (``attach``). ``open`` lists the bundles and loads those PRELOAD names."""

    def __init__(self, settings: Settings, factory: EngineFactory,
                 metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.factory = factory
        self.metrics = metrics
        self.budget_mb = settings.model_memory_mb
        self.directories = bundle_dirs(Path(settings.model_dir), settings.models)
        if not self.directories:
            raise RuntimeError(f"no model bundles in {settings.model_dir} (set MODEL_DIR)")
        self.bundles: dict[Pair, Bundle] = {}  # every pair served
        self.pairs_of: dict[Path, list[Pair]] = {}
        self.scheduler: Scheduler | None = None
        self._loaded: OrderedDict[Path, Resident] = OrderedDict()  # least recently used first
        self._in_use: Counter[Path] = Counter()  # requests holding (or awaiting) each model
        self._loading: dict[Path, asyncio.Future[Resident]] = {}  # on the event loop only
        self._state = threading.Lock()  # _loaded and _in_use, between the loop and a load
        self._load_lock = threading.Lock()  # one load or unload at a time
        self._measured: dict[Path, float] = {}  # MiB a quiet load of each bundle added
        self._served = 0  # requests that found their model loaded, ever (a quiet load's check)
        self._failed: dict[Path, tuple[float, str]] = {}  # (monotonic time, cause) of a failure

    @property
    def engines(self) -> dict[Pair, Engine]:
        """The loaded engines by pair."""
        with self._state:
            return {pair: resident.engine for directory, resident in self._loaded.items()
                    for pair in self.pairs_of[directory]}

    @property
    def resident_megabytes(self) -> float:
        with self._state:
            return sum(resident.megabytes for resident in self._loaded.values())

    def open(self, names: Sequence[str]) -> None:
        """Serve every bundle, loading those PRELOAD ``names`` (by pair, ``en-de``, or directory
        name) now, blocking; none named: every bundle without a budget, none with one. The
        others' manifests are read (their checksums are verified when they load)."""
        if not names and not self.budget_mb:  # all of them, as a service without a budget
            for directory in self.directories:
                self._load(directory)
            return
        for directory in self.directories:
            self._register(load_bundle(directory, verify_checksums=False))
        for directory in self._named(names):
            self._load(directory)

    def _named(self, names: Sequence[str]) -> list[Path]:
        chosen: list[Path] = []
        for name in names:
            found = [directory for directory, pairs in self.pairs_of.items()
                     if name == directory.name or name.lower() in map(pair_label, pairs)]
            if not found:
                served = ", ".join(sorted(map(pair_label, self.bundles)))
                raise RuntimeError(f"PRELOAD names {name}, which no bundle serves "
                                   f"(served: {served})")
            chosen += [directory for directory in found if directory not in chosen]
        return chosen

    def _register(self, bundle: Bundle) -> None:
        """``bundle``'s pairs served; raises when another bundle serves one of them."""
        pairs = [(source.lower(), target.lower()) for source, target in bundle.pairs]
        for pair in pairs:
            other = self.bundles.get(pair)
            if other is not None and other.dir != bundle.dir:
                raise RuntimeError(f"{bundle.dir} and {other.dir} both serve {pair_label(pair)}")
            self.bundles[pair] = bundle
        self.pairs_of[bundle.dir] = pairs
        if self.metrics is not None:  # listed from the start, loaded or not
            self.metrics.model_loaded.labels(bundle.dir.name).set(0)

    def attach(self, scheduler: Scheduler) -> None:
        """The scheduler the models loaded from now on get their lanes in."""
        self.scheduler = scheduler

    @contextlib.asynccontextmanager
    async def using(self, pair: Pair) -> AsyncIterator[Engine]:
        """``pair``'s engine, loaded first if need be, and kept loaded until the block ends.
        Concurrent first requests share one load; the load runs in a thread."""
        directory = self.bundles[pair].dir
        with self._state:
            # Counted before the load: a model someone waits for is never the one evicted.
            self._in_use[directory] += 1
            resident = self._loaded.get(directory)
            if resident is not None:
                self._loaded.move_to_end(directory)
                self._served += 1
        try:
            if resident is None:
                resident = await asyncio.shield(self._load_once(directory))
            yield resident.engine
        finally:
            with self._state:
                self._in_use[directory] -= 1

    def _load_once(self, directory: Path) -> asyncio.Future[Resident]:
        future = self._loading.get(directory)
        failed = self._failed.get(directory)
        if future is None and failed is not None:
            wait = failed[0] + LOAD_RETRY_S - time.monotonic()
            if wait > 0:  # the same answer, without trying the same load again
                raise self._failure(directory, failed[1], wait)
        if future is None:
            future = asyncio.ensure_future(asyncio.to_thread(self._load, directory))
            self._loading[directory] = future
            future.add_done_callback(lambda _: self._loading.pop(directory, None))
        return future

    def _load(self, directory: Path) -> Resident:
        """Load ``directory``'s model after unloading what the budget needs; blocking."""
        with self._load_lock:
            with self._state:
                resident = self._loaded.get(directory)
                if resident is not None:  # loaded while this waited for the lock
                    self._loaded.move_to_end(directory)
                    return resident
            needed = self._measured.get(directory, 0.0)
            if self.budget_mb and not needed:  # every manifest was read (``open``)
                bundle = self.bundles[self.pairs_of[directory][0]]
                needed = graph_megabytes(bundle, self.settings.variant) * ESTIMATE_FACTOR
            victims = self._evict(needed, keep=directory)
            for victim in victims:
                self._unload(victim)
            if victims:
                # An unloaded engine sits in reference cycles (its lanes, batches) that only the
                # cyclic collector frees: without this its sessions stayed resident until the
                # collector happened to run (+28 MiB per load of en-de, bench/many_pairs.py).
                # One the worker still holds from its last batch goes at the next load.
                collect_all()
            started = time.monotonic()
            quiet = self._quiet()
            before = rss_megabytes()
            try:
                engine = self.factory(directory, self.settings)
            except Exception as error:  # whatever a bundle's files make the load raise
                log.error("loading %s failed: %s: %s", directory, type(error).__name__, error)
                # Clients read it too: paths relative to MODEL_DIR, on one line.
                cause = " ".join(f"{type(error).__name__}: {error}".replace(
                    f"{directory.parent}/", "").split())[:500]
                self._failed[directory] = (time.monotonic(), cause)
                if self.metrics is not None:
                    self.metrics.model_load_failures.labels(directory.name).inc()
                raise self._failure(directory, cause, LOAD_RETRY_S) from error
            after = rss_megabytes()
            grown = (None if before is None or after is None or self._quiet() != quiet
                     or quiet is None else after - before)
            seconds = time.monotonic() - started
            self._failed.pop(directory, None)
            if directory not in self.pairs_of:
                self._register(engine.bundle)
            labels = [pair_label(pair) for pair in self.pairs_of[directory]]
            if self.scheduler is not None:
                self.scheduler.add_pairs({label: engine for label in labels})
            # (An engine that is not onnxruntime's, a test's, counts as its estimate.)
            floor = engine_megabytes(engine) if isinstance(engine, Engine) else needed
            if directory not in self._measured and grown is not None:
                self._measured[directory] = max(grown, floor)
            estimate = floor * ESTIMATE_FACTOR if isinstance(engine, Engine) else needed
            resident = Resident(engine, self._measured.get(directory, estimate))
            with self._state:
                self._loaded[directory] = resident
            log.info("loaded %s from %s on %s in %.1f s (%.0f MiB)", ", ".join(labels),
                     directory, getattr(engine, "device", self.settings.device), seconds,
                     resident.megabytes)
            if self.metrics is not None:
                self.metrics.model_loads.labels(directory.name).inc()
                self.metrics.model_load_seconds.observe(seconds)
                self.metrics.model_loaded.labels(directory.name).set(1)
            self._set_gauges()
            return resident

    def _quiet(self) -> int | None:
        """While no request runs on a loaded model, the count of those that have: a load
        between two equal counts ran alone. None while one runs."""
        with self._state:
            if any(self._in_use[directory] for directory in self._loaded):
                return None
            return self._served

    def _failure(self, directory: Path, cause: str, wait: float) -> ModelLoadFailed:
        return ModelLoadFailed([pair_label(pair) for pair in self.pairs_of.get(directory, [])]
                               or [directory.name], directory.name, cause, math.ceil(wait))

    def _evict(self, needed: float, keep: Path) -> list[Path]:
        """Take out of the loaded set, least recently used first, the models no request holds
        until ``needed`` MB fit in the budget; their lanes go next (``_unload``)."""
        victims: list[Path] = []
        if not self.budget_mb:
            return victims
        with self._state:
            total = sum(resident.megabytes for resident in self._loaded.values())
            for directory in list(self._loaded):
                if total + needed <= self.budget_mb:
                    break
                if directory != keep and not self._in_use[directory]:
                    total -= self._loaded.pop(directory).megabytes
                    victims.append(directory)
        if total + needed > self.budget_mb:
            log.warning("loading %s exceeds MODEL_MEMORY_MB=%g: the other models loaded are in "
                        "use", keep.name, self.budget_mb)
        return victims

    def _unload(self, directory: Path) -> None:
        labels = [pair_label(pair) for pair in self.pairs_of[directory]]
        if self.scheduler is not None:
            waited = 0.0
            while not self.scheduler.remove_pairs(labels):
                if waited > UNLOAD_WAIT_S:
                    raise RuntimeError(f"{directory.name}'s lanes did not empty in "
                                       f"{UNLOAD_WAIT_S:.0f} s")
                time.sleep(UNLOAD_POLL_S)
                waited += UNLOAD_POLL_S
        log.info("unloaded %s (least recently used)", ", ".join(labels))
        if self.metrics is not None:
            self.metrics.model_unloads.labels(directory.name).inc()
            self.metrics.model_loaded.labels(directory.name).set(0)
        self._set_gauges()

    def _set_gauges(self) -> None:
        if self.metrics is None:
            return
        with self._state:
            self.metrics.models_resident.set(len(self._loaded))
            self.metrics.models_resident_megabytes.set(
                sum(resident.megabytes for resident in self._loaded.values()))
