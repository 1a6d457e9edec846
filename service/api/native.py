"""The service's own API: ``POST /translate``, ``GET /languages``, ``/health``, ``/ready``,
``/metrics``. Routes only: HTTP in, texts to the Translator (``service.translator``), results
out.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from service.api.schemas import (
    Alternative,
    ErrorResponse,
    LanguagePair,
    LanguagesResponse,
    StatusResponse,
    TranslateRequest,
    TranslateResponse,
    TranslationResult,
)
from service.api.shared import (
    State,
    body_limit,
    check_texts,
    read_body,
    request_id_of,
    require_ready,
    resolve_pair,
    scheduler_error,
    take_rate,
    unless_disconnected,
)
from service.errors import ApiError, from_validation_errors
from service.scheduler import (
    SchedulerError,
)
from service.translator import (
    InvalidOption,
    TranslateOptions,
    fixed_options,
)

_bearer = HTTPBearer(auto_error=False, description="One of the API_KEYS, when any are set.")


async def require_api_key(
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    keys = state.settings.api_keys
    if not keys:
        return
    token = credentials.credentials.encode() if credentials else b""
    # compare_digest against every key: the time taken says nothing about which key is close.
    if not any([hmac.compare_digest(token, key.encode()) for key in keys]):
        raise ApiError(
            401,
            "unauthorized",
            "Missing or invalid API key; send 'Authorization: Bearer <key>'.",
            headers={"WWW-Authenticate": "Bearer"},
        )


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}
router = APIRouter()


@router.get("/health", response_model=StatusResponse, responses=_errors(503))
async def health(state: State) -> StatusResponse:
    """Liveness: fails only when a restart is the cure: the models failed to load, or the
    translation workers kept dying after being restarted (the service cannot translate)."""
    if state.phase == "failed":
        raise ApiError(503, "load_failed", f"Loading the models failed: {state.error}")
    if state.scheduler is not None and state.scheduler.failed:
        raise ApiError(503, "unavailable", "The translation workers failed; restart the service.")
    return StatusResponse(status="ok")


@router.get("/ready", response_model=StatusResponse, responses=_errors(503))
async def ready(state: State) -> StatusResponse:
    """Readiness: 200 once every bundle is loaded and warmed up, until the stop signal, and
    while at least one translation worker is healthy (not being restarted)."""
    if state.shutdown_started is not None:
        raise ApiError(
            503, "shutting_down", "The service is shutting down.", headers={"Retry-After": "5"}
        )
    require_ready(state)
    assert state.scheduler is not None  # ready implies a scheduler
    if not state.scheduler.healthy_workers:
        raise ApiError(
            503,
            "no_healthy_worker",
            "No translation worker is healthy; one is being restarted.",
            headers={"Retry-After": "1"},
        )
    return StatusResponse(status="ready")


@router.get("/metrics", response_class=Response)
async def metrics(state: State) -> Response:
    """Prometheus metrics."""
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/languages",
    response_model=LanguagesResponse,
    dependencies=[Depends(require_api_key)],
    responses=_errors(401),
)
async def languages(state: State) -> LanguagesResponse:
    """The language pairs loaded (empty while loading)."""
    return LanguagesResponse(
        pairs=[
            LanguagePair(source_lang=source, target_lang=target, model=engine.bundle.dir.name)
            for (source, target), engine in sorted(state.engines.items())
        ]
    )


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    dependencies=[Depends(require_api_key)],
    responses=_errors(400, 401, 413, 422, 429, 500, 503, 504),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
        }
    },
)
async def translate(request: Request, state: State) -> TranslateResponse:
    """Translate one text or a list of texts; one result per text, in order.

    Texts are split into sentences (and overlong sentences into pieces the model can take),
    translated in the shared running batch, and rejoined with the original whitespace.
    """
    request_id = request_id_of(request)
    # Errors carry the id the logs name. A success has nothing to look up, and a header on
    # it would cost every request FastAPI's merging of a Response parameter.
    try:
        return await _translate(request, state, request_id)
    except ApiError as exc:
        exc.headers.setdefault("X-Request-ID", request_id)
        raise


async def _translate(request: Request, state: State, request_id: str) -> TranslateResponse:
    deadline = asyncio.get_running_loop().time() + state.settings.request_timeout_s
    settings = state.settings
    body = await read_body(request, body_limit(settings))
    # Parsed here rather than by FastAPI so that any content type is accepted (curl -d sends
    # a form type) and invalid JSON / encodings get their own error codes.
    payload = _parse(body)
    texts = [payload.text] if isinstance(payload.text, str) else payload.text
    check_texts(texts, isinstance(payload.text, str), settings)
    options = TranslateOptions(
        beam_size=payload.beam_size, max_length=payload.max_length,
        no_repeat_ngram_size=payload.no_repeat_ngram_size,
        length_penalty=payload.length_penalty, max_length_ratio=payload.max_length_ratio,
        num_alternatives=payload.num_alternatives, return_scores=payload.return_scores,
        format=payload.format)
    with _invalid_option():
        fixed_options(options, settings)  # a bad request is refused before any other work
    if payload.format == "html" and (payload.num_alternatives or payload.return_scores):
        # A document's segments are translated apart: it has no one score or alternative.
        field = "num_alternatives" if payload.num_alternatives else "return_scores"
        raise ApiError(422, "invalid_field", f"{field} is not available with format html.",
                       field)
    require_ready(state)
    pair = resolve_pair(payload.source_lang, payload.target_lang, state.engines)
    take_rate(state, request, sum(map(len, texts)))
    assert state.translator is not None  # ready implies a translator
    work = state.translator.translate(texts, pair, options, deadline=deadline,
                                      request_id=request_id)
    try:
        results = await unless_disconnected(request, work)
    except SchedulerError as exc:
        raise scheduler_error(exc) from None
    return TranslateResponse(
        translations=[
            TranslationResult(
                text=result.text,
                score=result.score,
                alternatives=None if result.alternatives is None else
                [Alternative(text=text, score=score) for text, score in result.alternatives],
            )
            for result in results
        ],
        source_lang=pair[0],
        target_lang=pair[1],
    )


@contextmanager
def _invalid_option() -> Iterator[None]:
    try:
        yield
    except InvalidOption as exc:
        raise ApiError(422, "invalid_field", str(exc), exc.field) from None


def _parse(body: bytes) -> TranslateRequest:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, "invalid_encoding", f"Body is not valid UTF-8 (byte {exc.start})."
        ) from None
    try:
        # A leading byte-order mark is tolerated, as RFC 8259 allows.
        return TranslateRequest.model_validate_json(text.removeprefix("\ufeff"))
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
