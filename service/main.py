"""The app factory, its lifespan, and the ``translate-serve`` entry point.

Loading happens in the background: the server answers ``/health`` at once and ``/ready`` turns
200 once every bundle is loaded and has translated a warm-up sentence through the scheduler,
the same path requests take. Shutdown drains: the scheduler stops admitting, accepted sentences
finish (up to SHUTDOWN_GRACE_S), then the thread stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.api import Pair, ServiceState, pair_label, router
from service.bundle import MANIFEST, discover_bundles
from service.decoding import DecodeOptions, Engine
from service.errors import install_error_handlers
from service.metrics import Metrics, RequestMetricsMiddleware
from service.scheduler import Scheduler
from service.settings import Settings

log = logging.getLogger("service")

EngineFactory = Callable[[Path, Settings], Engine]
WARMUP_SENTENCE = "Hello world."


def default_engine(bundle_dir: Path, settings: Settings) -> Engine:
    return Engine(
        bundle_dir,
        device=settings.device,
        threads=settings.threads,
        variant=settings.variant,
        workers=settings.workers,
        memory_arena=settings.memory_arena,
    )


def bundle_dirs(model_dir: Path) -> list[Path]:
    """MODEL_DIR may be one bundle or a directory of bundles."""
    if (model_dir / MANIFEST).is_file():
        return [model_dir]
    return discover_bundles(model_dir)


def load_engines(settings: Settings, factory: EngineFactory) -> dict[Pair, Engine]:
    directories = bundle_dirs(settings.model_dir)
    if not directories:
        raise RuntimeError(f"no model bundles in {settings.model_dir} (set MODEL_DIR)")
    engines: dict[Pair, Engine] = {}
    for directory in directories:
        engine = factory(directory, settings)
        pair = (engine.bundle.source_lang.lower(), engine.bundle.target_lang.lower())
        if pair in engines:
            other = engines[pair].bundle.dir
            raise RuntimeError(f"{directory} and {other} both serve {pair_label(pair)}")
        engines[pair] = engine
        device = getattr(engine, "device", settings.device)
        log.info("loaded %s from %s on %s", pair_label(pair), directory, device)
    return engines


async def start_serving(state: ServiceState, factory: EngineFactory) -> None:
    """Load, start the scheduler, warm up, mark ready; on failure mark failed (never raise)."""
    settings = state.settings
    try:
        state.engines = await asyncio.to_thread(load_engines, settings, factory)
        scheduler = Scheduler(
            {pair_label(pair): engine for pair, engine in state.engines.items()},
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_rows=settings.max_batch_rows,
            max_queue=settings.max_queue,
            max_request_sentences=settings.max_request_sentences,
            batching=settings.batching,
            metrics=state.metrics,
        )
        scheduler.start()
        state.scheduler = scheduler
        for pair, engine in state.engines.items():
            sources = [engine.tokenize(WARMUP_SENTENCE)]
            await scheduler.translate(pair_label(pair), sources, DecodeOptions(max_length=16))
    except Exception as exc:
        log.exception("loading the models failed")
        state.error = f"{type(exc).__name__}: {exc}"
        state.phase = "failed"
        return
    if state.phase == "loading":  # not if shutdown began meanwhile
        state.phase = "ready"
        log.info("ready: %s", ", ".join(pair_label(pair) for pair in state.engines))


def create_app(
    settings: Settings | None = None, *, engine_factory: EngineFactory = default_engine
) -> FastAPI:
    settings = settings or Settings()
    state = ServiceState(settings=settings, metrics=Metrics())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(start_serving(state, engine_factory))
        try:
            yield
        finally:
            state.begin_shutdown()  # a no-op when the stop signal already began it
            if not loading.done():
                # The load runs in a thread that cannot be interrupted; wait for it so the
                # scheduler it may start gets drained too.
                await loading
            if state.scheduler is not None:
                # uvicorn has already spent part of the grace period waiting for open
                # requests: the whole shutdown stays within SHUTDOWN_GRACE_S, not twice it.
                drained = await state.scheduler.drain(state.grace_left())
                if not drained:
                    log.warning("shutdown grace period over; unfinished requests were failed")

    app = FastAPI(
        title="Translation service",
        summary="Self-hosted machine translation with continuous batching.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = state
    install_error_handlers(app)
    app.include_router(router)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestMetricsMiddleware, metrics=state.metrics)
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
    """uvicorn that starts the service's shutdown at the stop signal, not after the open
    connections close: requests arriving meanwhile get 503 and the grace period counts
    from the signal."""

    def __init__(self, config: uvicorn.Config, state: ServiceState) -> None:
        super().__init__(config)
        self.service_state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service_state.begin_shutdown()
        super().handle_exit(sig, frame)


def server_for(app: FastAPI, settings: Settings) -> Server:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=logging_config(settings),
        log_level=settings.log_level,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
    )
    return Server(config, app.state.service)


def run() -> None:
    """``translate-serve``: serve with uvicorn, configured from the environment."""
    settings = Settings()
    server_for(create_app(settings), settings).run()


if __name__ == "__main__":
    run()
