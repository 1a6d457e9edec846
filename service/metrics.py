"""Prometheus metrics, in a registry of their own per app (tests build many apps)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CLOSE_REASONS = ("header_timeout", "evicted", "refused")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "translate_http_requests",
            "HTTP requests by route template, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "translate_http_request_duration_seconds",
            "HTTP request latency by route template, method and status.",
            ["route", "method", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "translate_queue_depth", "Sentences waiting to join the running batch.", registry=r
        )
        self.queue_wait = Histogram(
            "translate_queue_wait_seconds",
            "Time a sentence waited before joining the batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "translate_batch_rows",
            "Decoder rows in the batch at each decoder step.",
            ["pair"],
            buckets=_ROW_BUCKETS,
            registry=r,
        )
        self.running_sentences = Gauge(
            "translate_running_sentences", "Sentences in the running batch.", ["pair"], registry=r
        )
        self.decode_steps = Counter(
            "translate_decode_steps", "Decoder steps run.", ["pair"], registry=r
        )
        self.generated_tokens = Counter(
            "translate_generated_tokens",
            "Target tokens generated (best hypothesis of each finished sentence).",
            ["pair"],
            registry=r,
        )
        self.source_tokens = Counter(
            "translate_source_tokens", "Source tokens encoded.", ["pair"], registry=r
        )
        self.sentences = Counter(
            "translate_sentences",
            "Sentences by outcome: leaving the scheduler (done, dropped, failed) or retried "
            "alone after a failed decoder step (retried).",
            ["pair", "outcome"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "translate_event_loop_lag_seconds",
            "How late the event loop runs callbacks, smoothed over about a second.",
            registry=r,
        )
        self.shed = Counter(
            "translate_requests_shed",
            "Requests refused with 503 before any work because the event loop lagged past "
            "MAX_LOOP_LAG_S.",
            registry=r,
        )
        self.connections = Gauge(
            "translate_http_connections", "Open client connections.", registry=r
        )
        self.connections_closed = Counter(
            "translate_http_connections_closed",
            "Client connections the server closed unasked, by reason: header_timeout (no "
            "complete headers in HEADER_TIMEOUT_S), evicted (idle, to make room at "
            "MAX_CONNECTIONS), refused (at MAX_CONNECTIONS with every connection busy).",
            ["reason"],
            registry=r,
        )
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)
        self.step_failures = Counter(
            "translate_step_failures",
            "Decoder steps that raised (each batch's sentences are then retried alone).",
            ["pair"],
            registry=r,
        )
        # The sentence cache (service.sentence_cache, CACHE_MB).
        self.sentence_cache_hits = Counter(
            "translate_sentence_cache_hits", "Sentences answered from the cache.", registry=r
        )
        self.sentence_cache_misses = Counter(
            "translate_sentence_cache_misses", "Sentences looked up and not found.", registry=r
        )
        self.sentence_cache_bytes = Gauge(
            "translate_sentence_cache_bytes", "Memory the entries hold.", registry=r
        )
        self.sentence_cache_entries = Gauge(
            "translate_sentence_cache_entries", "Sentences in the cache.", registry=r
        )
        # The state replicas share (service.shared_state, STATE_URL).
        self.state_store_up = Gauge(
            "translate_state_store_up", "1 while STATE_URL answers, 0 while limits and cache "
            "fall back to this process.", registry=r
        )
        self.state_store_errors = Counter(
            "translate_state_store_errors", "Calls to STATE_URL that failed or timed out.",
            registry=r
        )
        self.shared_cache_hits = Counter(
            "translate_shared_cache_hits", "Sentences found in the replicas' cache tier.",
            registry=r
        )
        self.shared_cache_misses = Counter(
            "translate_shared_cache_misses", "Sentences looked up there and not found.",
            registry=r
        )
        self.worker_failures = Counter(
            "translate_worker_failures",
            "Worker threads that died; each is replaced, up to a limit (see service.scheduler).",
            registry=r,
        )

        # Models loaded on their first request within MODEL_MEMORY_MB (service.residency).
        self.model_loads = Counter(
            "translate_model_loads", "Models loaded, by bundle directory.", ["model"], registry=r
        )
        self.model_unloads = Counter(
            "translate_model_unloads", "Models unloaded to make room, by bundle directory.",
            ["model"], registry=r
        )
        self.model_load_seconds = Histogram(
            "translate_model_load_seconds", "Time to load a model (sessions opened).",
            buckets=_LATENCY_BUCKETS, registry=r
        )
        self.model_load_failures = Counter(
            "translate_model_load_failures",
            "Loads that failed (a corrupt or unloadable bundle), by bundle directory.",
            ["model"], registry=r
        )
        self.model_loaded = Gauge(
            "translate_model_loaded",
            "1 while the bundle's model is loaded, 0 while it is served but not loaded, by "
            "bundle directory (translate-models list reads it).", ["model"], registry=r
        )
        self.models_resident = Gauge(
            "translate_models_resident", "Models loaded now.", registry=r
        )
        self.models_resident_megabytes = Gauge(
            "translate_models_resident_megabytes",
            "Memory of the models loaded now, in MiB, as MODEL_MEMORY_MB counts it: what each "
            "one's load added to the resident memory (see service.residency).", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def pair(self, pair: str) -> PairMetrics:
        """The scheduler's series for one language pair, created now (so they read 0 before
        the first sentence rather than being absent)."""
        return PairMetrics(
            batch_rows=self.batch_rows.labels(pair),
            running_sentences=self.running_sentences.labels(pair),
            decode_steps=self.decode_steps.labels(pair),
            generated_tokens=self.generated_tokens.labels(pair),
            source_tokens=self.source_tokens.labels(pair),
            sentences={outcome: self.sentences.labels(pair, outcome)
                       for outcome in ("done", "dropped", "failed", "retried")},
            step_failures=self.step_failures.labels(pair),
        )


@dataclass(frozen=True)
class PairMetrics:
    """One pair's children of the labelled metrics, looked up once: the scheduler updates
    them at every decoder step, and ``labels()`` costs more than the update (four updates a
    step: 14 us with the lookups, 5 without)."""

    batch_rows: Any
    running_sentences: Any
    decode_steps: Any
    generated_tokens: Any
    source_tokens: Any
    sentences: dict[str, Any]  # by outcome: done, dropped, failed, retried
    step_failures: Any


class RequestMetricsMiddleware:
    """Counts and times every HTTP request, labelled by route template, not raw path.

    Raw paths would let any client create label values (and series) at will; the template the
    router matched is bounded. Unmatched paths are labelled "unmatched".
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees if the app raises before answering

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            labels = (template, scope["method"], str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - started)
