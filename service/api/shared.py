"""What the API shapes share: the service's state (``ServiceState``, on
``app.state.service``, filled by the lifespan in ``service.main``; routes read it through
``Depends(get_state)``) and the request plumbing every adapter uses: request ids, keys and
rate limits, reading a bounded body, the text limits, which loaded pair a request means,
abandoning work when the client hangs up, and the HTTP answer to each scheduler error.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, Request

from service.detect import LanguageDetector
from service.engine import Engine
from service.errors import ApiError
from service.metrics import Metrics
from service.ratelimit import OverCharLimit, RateLimited, RateLimiter, Usage
from service.scheduler import (
    DeadlineExceeded,
    QueueFull,
    RequestTooLarge,
    Scheduler,
    SchedulerError,
    SchedulerFailed,
    ShuttingDown,
    TranslationFailed,
    WorkerRestarted,
)
from service.settings import Settings
from service.translator import (
    Pair,
    Translator,
    pair_label,
)

T = TypeVar("T")
DEFAULT_PAIR: Pair = ("en", "de")  # the tie-breaker when several loaded pairs would fit
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a client's X-Request-ID we log as is
# Ids made here: the process and a count, unique across replicas of the service without the
# ~7 us of a uuid4.
_ID_PREFIX = f"{os.getpid():x}-{int(time.time()):x}-"
_request_ids = itertools.count(1)


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics
    phase: Literal["loading", "ready", "draining", "failed"] = "loading"
    error: str | None = None
    translator: Translator | None = None  # set once the models are loaded
    shutdown_started: float | None = None  # time.monotonic() of the stop signal
    drained: asyncio.Task[bool] | None = None
    limiter: RateLimiter = field(init=False)
    usage: Usage = field(default_factory=Usage)

    def __post_init__(self) -> None:
        self.limiter = RateLimiter(
            self.settings.requests_per_minute, self.settings.chars_per_minute
        )

    @property
    def engines(self) -> dict[Pair, Engine]:
        """The loaded engines by pair; none while loading."""
        return self.translator.engines if self.translator is not None else {}

    @property
    def scheduler(self) -> Scheduler | None:
        return self.translator.scheduler if self.translator is not None else None

    def detect_languages(self, texts: Sequence[str], candidates: Sequence[str],
                         ) -> list[tuple[str, float]]:
        """(language, confidence 0-1) for each of ``candidates``, best first, over ``texts``
        together; empty when they hold no letters (``service.detect``)."""
        return LanguageDetector(candidates).detect("\n".join(texts))

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


def require_ready(state: ServiceState) -> None:
    if state.phase == "ready" and state.scheduler is not None and state.scheduler.accepting:
        return
    if state.phase == "failed":
        raise ApiError(503, "load_failed", f"Loading the models failed: {state.error}")
    if state.phase == "loading":
        message, code = "Models are still loading.", "not_ready"
    elif state.phase == "ready":  # yet the scheduler refuses: its thread died
        message, code = "The translation worker failed; restart the service.", "unavailable"
    else:
        message, code = "The service is shutting down.", "shutting_down"
    raise ApiError(503, code, message, headers={"Retry-After": "5"})


def request_id_of(request: Request) -> str:
    """The client's X-Request-ID when it is a plain token, else a new one: the logs of a
    failure name it, and so does the error response."""
    given = request.headers.get("x-request-id")
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return f"{_ID_PREFIX}{next(_request_ids):x}"


def client_key(request: Request, settings: Settings, api_key: str | None = None) -> str:
    """Whom the rate limits and usage count: the API key (already checked), else the client
    address. The key is ``api_key`` where the API carries it elsewhere than as a bearer token
    (LibreTranslate's body field, DeepL's header), else the Authorization header's token."""
    if settings.api_keys:
        if api_key is None:
            api_key = request.headers.get("authorization", "").partition(" ")[2].strip()
        return "key:" + api_key
    return "addr:" + (request.client.host if request.client else "")


def take_rate(state: ServiceState, request: Request, chars: int,
              api_key: str | None = None) -> None:
    """Count a request of ``chars`` characters against its client's limits (``client_key``),
    or refuse it with 429 and Retry-After."""
    limiter = state.limiter
    if not limiter.enabled:
        return
    try:
        limiter.take(client_key(request, state.settings, api_key), chars)
    except OverCharLimit as exc:
        raise ApiError(
            413,
            "over_rate_limit",
            f"{exc.chars} characters; at most {exc.limit} per minute (CHARS_PER_MINUTE).",
            "text",
        ) from None
    except RateLimited as exc:
        raise ApiError(
            429,
            "rate_limited",
            f"Too many requests or characters; this client's {exc.limit} is exceeded.",
            headers={"Retry-After": str(exc.retry_after)},
        ) from None


def body_limit(settings: Settings) -> int:
    # The largest body a valid request can be: every char JSON-escaped at worst (12 bytes for
    # a surrogate pair), plus room for the other fields. Anything larger is refused unread.
    return settings.max_texts * (settings.max_chars * 12 + 8) + 4096


async def read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(
        413,
        "body_too_large",
        f"Request body exceeds {limit} bytes.",
        headers={"Connection": "close"},
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def check_texts(texts: Sequence[str], single: bool, settings: Settings) -> None:
    if len(texts) > settings.max_texts:
        raise ApiError(
            413,
            "too_many_texts",
            f"{len(texts)} texts; at most {settings.max_texts} per request (MAX_TEXTS).",
            "text",
        )
    for index, text in enumerate(texts):
        if len(text) > settings.max_chars:
            raise ApiError(
                413,
                "text_too_long",
                f"{len(text)} characters; at most {settings.max_chars} per text (MAX_CHARS).",
                "text" if single else f"text[{index}]",
            )
    total = sum(map(len, texts))
    if total > settings.max_request_chars:
        raise ApiError(
            413,
            "too_many_characters",
            f"{total} characters; at most {settings.max_request_chars} per request "
            "(MAX_REQUEST_CHARS). Send the texts in several requests.",
            "text",
        )


def resolve_pair(source: str | None, target: str | None, engines: dict[Pair, Any]) -> Pair:
    """The loaded pair a request means. Omitted languages are inferred when only one loaded
    pair fits, and default to en and de when several do."""
    source = source.strip().lower() if source else None
    target = target.strip().lower() if target else None
    fits = [
        pair
        for pair in engines
        if (source is None or pair[0] == source) and (target is None or pair[1] == target)
    ]
    if len(fits) > 1:
        wanted = (source or DEFAULT_PAIR[0], target or DEFAULT_PAIR[1])
        fits = [pair for pair in fits if pair == wanted] or fits
    if len(fits) == 1:
        return fits[0]
    loaded = ", ".join(pair_label(pair) for pair in sorted(engines)) or "none yet"
    if fits:
        raise ApiError(
            422,
            "ambiguous_language_pair",
            f"Several loaded pairs fit; give source_lang and target_lang. Loaded: {loaded}.",
            "target_lang" if target is None else "source_lang",
        )
    known_source = source is None or any(pair[0] == source for pair in engines)
    raise ApiError(
        422,
        "unsupported_language_pair",
        f"No model for {source or '*'} -> {target or '*'}. Loaded: {loaded}.",
        "target_lang" if known_source else "source_lang",
    )


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, abandoning it if the client hangs up first: a client that gave up (and
    perhaps retries) must not keep its sentences in the batch until the deadline."""

    async def disconnected() -> None:
        # The body is read, so the next ASGI message can only be the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # frees the request's rows in the scheduler
    if task not in done:
        raise ApiError(499, "client_closed_request", "The client closed the connection.")
    return task.result()


def scheduler_error(exc: SchedulerError) -> ApiError:
    """The HTTP answer to each of the scheduler's refusals and failures."""
    if isinstance(exc, RequestTooLarge):
        return ApiError(
            413,
            "too_many_sentences",
            f"About {exc.sentences} sentences; at most {exc.limit} per request "
            "(MAX_REQUEST_SENTENCES). Send the texts in several requests.",
            "text",
        )
    if isinstance(exc, QueueFull):
        return ApiError(
            429,
            "queue_full",
            "Too many sentences waiting; retry later.",
            headers={"Retry-After": str(exc.retry_after)},
        )
    if isinstance(exc, ShuttingDown):
        return ApiError(
            503, "shutting_down", "The service is shutting down.", headers={"Retry-After": "5"}
        )
    if isinstance(exc, SchedulerFailed):
        return ApiError(
            503, "unavailable", "The translation workers failed.", headers={"Retry-After": "5"}
        )
    if isinstance(exc, WorkerRestarted):
        return ApiError(
            503,
            "worker_restarted",
            "The worker translating this request failed and was restarted; retry.",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, TranslationFailed):
        return ApiError(
            500,
            "translation_failed",
            "A sentence of this request failed in the decoder, also when retried alone "
            f"(request id {exc.request_id}).",
        )
    if isinstance(exc, DeadlineExceeded):
        return ApiError(
            504,
            "timeout",
            "The translation did not finish within the request timeout; it was abandoned.",
        )
    return ApiError(500, "internal_error", str(exc))
