"""The app factory, its lifespan, and the ``translate-serve`` entry point.

Loading happens in the background: the server answers ``/health`` at once and ``/ready`` turns
200 once every bundle PRELOAD names (all of them without MODEL_MEMORY_MB) is loaded and has
translated a warm-up sentence through the scheduler, the same path requests take; the others
load on their first request (``service.residency``). Shutdown drains: the scheduler stops
admitting, accepted sentences finish (up to SHUTDOWN_GRACE_S), then the thread stops;
``Server`` puts the shutdown delay before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config
import math
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.allocator import fix_mmap_threshold, numpy_hugepages
from service.api import deepl, deepl_documents, deepl_glossaries, libretranslate, native, page
from service.api.private import PrivateRoutesMiddleware
from service.collector import freeze_survivors
from service.connections import (
    BodyDeadlineMiddleware,
    CloseWhenStoppingMiddleware,
    GuardedConfig,
    close_listeners,
    fit_open_file_limit,
)
from service.documents.parsers import close_all as close_parsers
from service.errors import CancelledRequestMiddleware, ErrorShapes, install_error_handlers
from service.install_on_start import install_missing
from service.loading import EngineFactory, default_engine
from service.metrics import Metrics, RequestMetricsMiddleware
from service.probes import ProbeServer
from service.sentence_cache import SharedTier
from service.settings import Settings, settings_from_args
from service.state import ServiceState
from service.translator import Translator, pair_label

log = logging.getLogger("service")

# The drain answers every request in the scheduler within SHUTDOWN_GRACE_S; this long after,
# uvicorn cancels whatever is left (CancelledRequestMiddleware answers it with 503).
SHUTDOWN_BACKSTOP_S = 2
EXIT_FAILED = 3  # loading or the workers failed beyond repair: a restart policy should act
# How long a thread running Python keeps the GIL while another waits for it (Python's default
# 5 ms). The event loop waits that long for each GIL it gives up at a socket call while a thread
# parses or checks (a large inline glossary): at 5 ms /health took up to 160-190 ms in
# bench/chaos.py's glossary phase, at 1 ms at most 96, with the same throughput.
GIL_SWITCH_INTERVAL_S = 0.001


async def start_serving(state: ServiceState, factory: EngineFactory) -> None:
    """Load, start the scheduler, warm up, mark ready; on failure mark failed (never raise)."""
    try:
        await asyncio.to_thread(install_missing, state.settings)
        translator = await asyncio.to_thread(Translator.load, state.settings, factory,
                                             state.metrics)
        state.translator = translator
        if state.store is not None and state.settings.shared_cache_entries:
            translator.shared_cache = SharedTier(state.store, state.settings.shared_cache_entries,
                                                 state.settings.shared_cache_ttl_s, state.metrics)
        await translator.warm_up()
        freeze_survivors()  # the loaded models' objects, out of the collector's passes
    except Exception as exc:
        log.exception("loading the models failed")
        state.error = f"{type(exc).__name__}: {exc}"
        state.phase = "failed"
        return
    if state.phase == "loading" and state.shutdown_started is None:  # not once stopping
        state.phase = "ready"
        loaded = set(state.engines)
        log.info("ready: %s", ", ".join(pair_label(pair) + ("" if pair in loaded else
                                                             " (loaded on first request)")
                                        for pair in state.pairs))


def create_app(
    settings: Settings | None = None, *, engine_factory: EngineFactory = default_engine
) -> FastAPI:
    settings = settings or Settings()
    state = ServiceState(settings=settings, metrics=Metrics())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.open_keys()  # before the first request: a managed key works at once
        keys_fresh = asyncio.create_task(state.keys.keep_fresh())
        loading = asyncio.create_task(start_serving(state, engine_factory))
        state.loop_lag.start()
        try:
            yield
        finally:
            keys_fresh.cancel()
            await state.loop_lag.stop()
            state.begin_shutdown()  # a no-op when the stop signal already began it
            if not loading.done():
                # The load runs in a thread that cannot be interrupted; wait for it so the
                # scheduler it may start gets drained too.
                await loading
            draining = state.start_draining()  # begun already when served by ``Server``
            if draining is not None and not await draining:
                log.warning("shutdown grace period over; unfinished requests got 503")
            await state.documents.close()  # documents still translating end as errors
            await asyncio.to_thread(close_parsers)  # the workers that parse them
            await state.usage.close()  # the counts not yet shared
            if state.store is not None:
                await state.store.close()

    app = FastAPI(
        title="Translation service",
        summary="Self-hosted machine translation with continuous batching.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = state
    routers = [native.router, libretranslate.router, deepl.router, deepl_glossaries.router,
               deepl_glossaries.v3, deepl_documents.router]
    shapes = ErrorShapes(native.ERRORS, routers)
    install_error_handlers(app, shapes)
    for api_router in routers:
        app.include_router(api_router)
    if settings.page:
        app.include_router(page.router)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(PrivateRoutesMiddleware, state=state, shapes=shapes)
    app.add_middleware(BodyDeadlineMiddleware, timeout_s=settings.body_timeout_s)
    app.add_middleware(CancelledRequestMiddleware)
    app.add_middleware(RequestMetricsMiddleware, metrics=state.metrics)
    app.add_middleware(CloseWhenStoppingMiddleware,
                       stopping=lambda: state.shutdown_started is not None)
    return app


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def logging_config(settings: Settings) -> dict[str, Any]:
    if settings.log_json:
        formatter: dict[str, Any] = {"()": JsonFormatter}
    else:
        formatter = {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    level = settings.log_level.upper()
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "default",
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"default": handler},
        "root": {"handlers": ["default"], "level": level},
        "loggers": {
            # uvicorn's own loggers would otherwise bring their own handlers and format.
            name: {"handlers": [], "level": level, "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


class Server(uvicorn.Server):
    """uvicorn with the service's stop sequence. At the stop signal /ready turns 503 while
    requests are still served, for SHUTDOWN_DELAY_S, so that load balancers notice and stop
    sending; their responses close their connections (``CloseWhenStoppingMiddleware``). Then
    the listener closes (taking the connections the kernel has completed on it), admission
    stops and accepted requests (those on connections still expecting one too) have
    SHUTDOWN_GRACE_S to finish; the scheduler fails those still running, which get the
    documented 503 rather than uvicorn's bare 500 for a cancelled request. A second Ctrl+C
    exits at once, as with plain uvicorn. With a probe port (``service.probes``) its listener
    opens first, before the models load, and closes last, so that the probes are answered
    through the whole stop sequence."""

    def __init__(self, config: uvicorn.Config, state: ServiceState,
                 probes: ProbeServer | None = None) -> None:
        super().__init__(config)
        self.service_state = state
        self.probes = probes

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.probes is not None:  # a port in use fails the start before anything loads
            await self.probes.start()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service_state.begin_shutdown()
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        state = self.service_state
        if state.failed_beyond_repair and not self.should_exit:
            # Beyond repair in this process: exit (non-zero, see ``serve``) so that whatever
            # runs the service restarts it (a volume mounted late, memory freed) or shows it
            # failing; /health already fails for Kubernetes.
            why = ("loading the models failed" if state.phase == "failed" else
                   "the translation workers kept failing")
            log.error("%s; exiting so the service restarts", why)
            self.should_exit = True
        if not await super().on_tick(counter):
            return False
        state.begin_shutdown()  # also when asked to exit other than by a signal
        return self.force_exit or state.delay_left() <= 0

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Draining runs beside uvicorn's wait for open connections, which it ends by
        # answering every accepted request within the grace period.
        await close_listeners(self.servers, self.new_connection)  # uvicorn's close: a no-op
        self.service_state.start_draining()
        await super().shutdown(sockets)
        if self.probes is not None:
            await self.probes.stop()

    def new_connection(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn's startup makes them for its listeners."""
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )


def server_for(app: FastAPI, settings: Settings) -> Server:
    config = GuardedConfig(
        app,
        host=settings.host,
        port=settings.port,
        log_config=logging_config(settings),
        log_level=settings.log_level,
        timeout_keep_alive=settings.keep_alive_s,
        header_timeout_s=settings.header_timeout_s,
        max_connections=fit_open_file_limit(settings.max_connections),
        metrics=app.state.service.metrics,
        trusted_proxies=settings.trusted_proxies,
        loop_lag=lambda: app.state.service.loop_lag.seconds,
        max_loop_lag_s=settings.max_loop_lag_s,
        backlog=settings.listen_backlog,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s) + SHUTDOWN_BACKSTOP_S,
    )
    probes = None
    if settings.probe_port:
        probes = ProbeServer(app, host=settings.host, port=settings.probe_port,
                             metrics=app.state.service.metrics,
                             header_timeout_s=settings.header_timeout_s,
                             timeout_keep_alive=settings.keep_alive_s,
                             timeout_graceful_shutdown=SHUTDOWN_BACKSTOP_S)
    return Server(config, app.state.service, probes)


def serve(settings: Settings, engine_factory: EngineFactory = default_engine) -> None:
    """Serve until a stop signal, then shut down as ``Server`` describes. Exits with status
    ``EXIT_FAILED`` when loading the models or the translation workers failed beyond
    repair."""
    fix_mmap_threshold(settings.malloc_mmap_threshold_kb)  # before any worker thread
    numpy_hugepages(settings.numpy_hugepages)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    server = server_for(create_app(settings, engine_factory=engine_factory), settings)
    server.run()
    if server.service_state.failed_beyond_repair:
        sys.exit(EXIT_FAILED)


def run(args: Sequence[str] | None = None) -> None:
    """``translate-serve [--flag value ...]``: the environment's settings, overridden by the
    flags (``--help`` lists them)."""
    serve(settings_from_args(args))


if __name__ == "__main__":
    run()
