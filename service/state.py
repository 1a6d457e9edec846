"""What the service holds while it runs: its settings, phase, Translator, keys, limits, usage,
glossaries and documents, and the state store replicas share when STATE_URL names one
(``ServiceState``, on ``app.state.service``, filled by the lifespan in ``service.main``; routes
read it through ``Depends(get_state)``), and the stop sequence's timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import Depends, Request

from service.bundle import Bundle
from service.detect import LanguageDetector
from service.documents import DocumentJobs
from service.documents.parsers import parsers
from service.engine import Engine
from service.glossary import GlossaryStore, SharedGlossaryStore
from service.keys import Keys, key_book
from service.metrics import Metrics
from service.overload import LoopLag
from service.ratelimit import FailedKeys, Limits, RateLimiter, Usage
from service.scheduler import Scheduler
from service.settings import Settings
from service.shared_state import StateStore
from service.translator import Pair, Translator

DETECT_CHARS = 2000


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics
    phase: Literal["loading", "ready", "draining", "failed"] = "loading"
    error: str | None = None
    translator: Translator | None = None  # set once the models are loaded
    shutdown_started: float | None = None  # time.monotonic() of the stop signal
    drained: asyncio.Task[bool] | None = None
    store: StateStore | None = field(init=False)  # STATE_URL's, shared by the replicas
    keys: Keys = field(init=False)
    limiter: Limits = field(init=False)
    failed_keys: FailedKeys = field(init=False)  # per client address, in the process
    usage: Usage = field(init=False)
    loop_lag: LoopLag = field(default_factory=LoopLag)
    _glossaries: GlossaryStore | SharedGlossaryStore | None = field(default=None, init=False,
                                                                    repr=False)
    documents: DocumentJobs = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self.store = (StateStore(settings.state_url, settings.state_timeout_s, self.metrics)
                      if settings.state_url else None)
        self.keys = Keys(settings, None)
        self.limiter = Limits(RateLimiter(settings.requests_per_minute,
                                          settings.chars_per_minute), self.store)
        self.failed_keys = FailedKeys(settings.failed_keys_per_minute)
        self.usage = Usage(self.store)
        self.documents = DocumentJobs(
            settings.max_documents, settings.document_ttl_s,
            parsers(settings.document_workers, settings.document_worker_mb), self.store,
            settings.document_lease_s, max_bytes=settings.document_memory_mb * 2**20)

    async def open_keys(self) -> None:
        """The managed keys' table opened (DATA_DIR's file, or the shared store) and read."""
        self.keys = Keys(self.settings, key_book(self.settings, self.store))
        await self.keys.refresh()

    @property
    def glossaries(self) -> GlossaryStore | SharedGlossaryStore:
        """The glossaries' store: the shared one, else the SQLite file under DATA_DIR, opened
        (created) on first use."""
        if self._glossaries is None:
            self._glossaries = (SharedGlossaryStore(self.store) if self.store is not None else
                                GlossaryStore(self.settings.data_dir / "glossaries.sqlite3"))
        return self._glossaries

    @property
    def engines(self) -> dict[Pair, Engine]:
        """The loaded engines by pair; none while loading."""
        return self.translator.engines if self.translator is not None else {}

    @property
    def pairs(self) -> dict[Pair, Bundle]:
        """Every pair served, loaded or not (``Translator.pairs``); none while loading."""
        return self.translator.pairs if self.translator is not None else {}

    @property
    def pivots(self) -> dict[Pair, str]:
        """The pairs served through English (``Translator.pivots``); none while loading."""
        return self.translator.pivots if self.translator is not None else {}

    @property
    def failed_beyond_repair(self) -> bool:
        """Loading the models failed, or the translation workers kept failing: this process
        cannot translate, and should exit for a restart policy to act."""
        return self.phase == "failed" or (self.scheduler is not None and self.scheduler.failed)

    @property
    def scheduler(self) -> Scheduler | None:
        return self.translator.scheduler if self.translator is not None else None

    def detect_languages(self, texts: Sequence[str], candidates: Sequence[str],
                         ) -> list[tuple[str, float]]:
        """(language, confidence 0-1) for each of ``candidates``, best first, over ``texts``
        together; empty when they hold no letters (``service.detect``). Only the first
        ``DETECT_CHARS`` characters are read: a language shows in a paragraph, and the
        detector runs on the event loop."""
        sample = "\n".join(texts)[:DETECT_CHARS]
        return LanguageDetector(candidates).detect(sample)

    def begin_shutdown(self) -> None:
        """At the stop signal: /ready turns 503 so that load balancers stop sending; requests
        are still served until ``start_draining``."""
        if self.shutdown_started is None:
            self.shutdown_started = time.monotonic()

    def delay_left(self) -> float:
        """What is left of SHUTDOWN_DELAY_S, counted from the stop signal."""
        if self.shutdown_started is None:
            return self.settings.shutdown_delay_s
        elapsed = time.monotonic() - self.shutdown_started
        return max(0.0, self.settings.shutdown_delay_s - elapsed)

    def start_draining(self) -> asyncio.Task[bool] | None:
        """From now on new requests get 503; accepted ones have SHUTDOWN_GRACE_S to finish, and
        those still running then get 503. Once; the task says whether all finished."""
        self.begin_shutdown()
        if self.phase != "failed":
            self.phase = "draining"
        if self.drained is None and self.scheduler is not None:
            drain = self.scheduler.drain(self.settings.shutdown_grace_s)
            self.drained = asyncio.ensure_future(drain)
        return self.drained


# Dependencies are coroutines: FastAPI runs a plain ``def`` dependency in its thread pool, two
# thread hops per request for what is an attribute read.
async def get_state(request: Request) -> ServiceState:
    return request.app.state.service


State = Annotated[ServiceState, Depends(get_state)]
