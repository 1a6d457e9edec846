"""The service's own API: ``POST /translate``, ``GET /languages``, ``/health``, ``/ready``,
``/metrics``. Routes only: the request shape parsed into the pipeline's request
(``service.pipeline``), its result rendered; its routes raise, and their errors are answered
through ``NATIVE`` in the service's own error shape (``service.errors``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field, ValidationError

from service import pipeline
from service.api.fields import key_of
from service.api.replies import MALFORMED, SERVICE_SIDE, Reply, table_error
from service.api.schemas import (
    Alternative,
    ErrorResponse,
    LanguagePair,
    LanguagesResponse,
    Sentence,
    StatusResponse,
    TranslateRequest,
    TranslateResponse,
    TranslationResult,
    translate_request,
)
from service.api.uploads import document_request, download
from service.documents import DONE, DocumentJob
from service.errors import ApiError, ErrorShape, ShapedRoute, error_body, from_validation_errors
from service.pipeline import (
    PipelineError,
    PipelineRequest,
    check_key,
    owner_of,
    require_ready,
)
from service.state import State
from service.translator import TranslateOptions

# The status of each pipeline error, and the service's own code for it where it differs.
NATIVE: dict[str, Reply] = {
    **{code: Reply(400) for code in ("invalid_encoding", "invalid_json")},
    **{code: Reply(422) for code in MALFORMED if code not in ("invalid_encoding",
                                                               "invalid_json")},
    "missing_key": Reply(401, "Missing or invalid API key; send 'Authorization: Bearer <key>'.",
                         "unauthorized"),
    "invalid_key": Reply(401, "Missing or invalid API key; send 'Authorization: Bearer <key>'.",
                         "unauthorized"),
    "too_many_failed_keys": Reply(429),
    "body_too_large": Reply(413),
    "too_many_texts": Reply(413),
    "text_too_long": Reply(413),
    "too_many_characters": Reply(413),
    "too_many_sentences": Reply(413),
    "unsupported_language_pair": Reply(422),
    "ambiguous_language_pair": Reply(422),
    "over_rate_limit": Reply(413),
    "rate_limited": Reply(429),
    "queue_full": Reply(429),
    "quota_exceeded": Reply(403),
    "glossary_not_found": Reply(404),
    "too_many_glossary_entries": Reply(413),
    "too_many_glossaries": Reply(403),
    "invalid_document": Reply(400),
    "document_too_large": Reply(413),
    "document_not_found": Reply(404),
    "document_not_ready": Reply(409),
    **SERVICE_SIDE,
}


def native_error(error: PipelineError) -> ApiError:
    answer = table_error(NATIVE, error)
    if answer.status == 401:
        answer.headers["WWW-Authenticate"] = "Bearer"
    return answer


ERRORS = ErrorShape(native_error, lambda error: error_body(error.code, error.message,
                                                            error.field))


class NativeRoute(ShapedRoute):
    error_shape = ERRORS


_bearer = HTTPBearer(auto_error=False, description="One of the API_KEYS, when any are set.")


async def require_api_key(
    request: Request,
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    check_key(state, request, credentials.credentials if credentials else "")


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}


router = APIRouter(route_class=NativeRoute)


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
    """Readiness: 200 once the bundles PRELOAD names (every one without MODEL_MEMORY_MB) are
    loaded and warmed up, until the stop signal, and
    while at least one translation worker is healthy (not being restarted)."""
    if state.shutdown_started is not None:
        raise PipelineError("shutting_down", "The service is shutting down.", retry_after=5)
    require_ready(state)
    assert state.scheduler is not None  # ready implies a scheduler
    if not state.scheduler.healthy_workers:
        raise PipelineError("no_healthy_worker",
                            "No translation worker is healthy; one is being restarted.",
                            retry_after=1)
    return StatusResponse(status="ready")


@router.get("/metrics", response_class=Response)
async def metrics(state: State) -> Response:
    """Prometheus metrics."""
    state.metrics.loop_lag.set(state.loop_lag.seconds)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/languages",
    response_model=LanguagesResponse,
    response_model_exclude_none=True,
    dependencies=[Depends(require_api_key)],
    responses=_errors(401),
)
async def languages(state: State) -> LanguagesResponse:
    """The language pairs served (empty while loading): each bundle's, loaded or loaded on
    its first request, and those two bundles serve through English, marked with
    ``pivot_lang``."""
    bundles = state.pairs
    pairs = [LanguagePair(source_lang=source, target_lang=target, model=bundle.dir.name)
             for (source, target), bundle in bundles.items()]
    for (source, target), via in state.pivots.items():
        legs = (bundles[source, via].dir.name, bundles[via, target].dir.name)
        pairs.append(LanguagePair(source_lang=source, target_lang=target, model="+".join(legs),
                                  pivot_lang=via))
    return LanguagesResponse(pairs=sorted(pairs, key=lambda p: (p.source_lang, p.target_lang)))


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    responses=_errors(400, 401, 403, 413, 422, 429, 500, 503, 504),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
        }
    },
)
async def translate(
    request: Request,
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> TranslateResponse:
    """Translate one text or a list of texts; one result per text, in order.

    Texts are split into sentences (and overlong sentences into pieces the model can take),
    translated in the shared running batch, and rejoined with the original whitespace.
    ``source_lang: "auto"`` detects the source among the languages translated into the target.
    """
    answer = await pipeline.translate(state, request, _parse,
                                      key=credentials.credentials if credentials else "")
    return TranslateResponse(
        translations=[
            TranslationResult(
                text=result.text,
                score=result.score,
                alternatives=_alternatives(result.alternatives),
                sentences=None if result.sentences is None else [
                    Sentence(source=sentence.source, text=sentence.text, score=sentence.score,
                             alternatives=_alternatives(sentence.alternatives))
                    for sentence in result.sentences],
                separators=result.separators,
            )
            for result in answer.results
        ],
        source_lang=answer.pair[0],
        target_lang=answer.pair[1],
        pivot_lang=answer.via,
    )


class DocumentAccepted(BaseModel):
    document_id: str
    document_key: str = Field(description="Show it (?document_key=) to see the status and to "
                              "download the file.")
    status: str


class DocumentStatus(BaseModel):
    document_id: str
    status: str = Field(description="queued, translating, done or error.")
    characters: int = Field(description="Characters in the document, as billed.")
    error: str | None = None


@router.post("/translate/document", status_code=202, response_model=DocumentAccepted,
             responses=_errors(400, 401, 413, 422, 429, 503))
async def translate_document(
    request: Request, state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> DocumentAccepted:
    """Upload a document (multipart/form-data: ``file``, ``target_lang``, ``source_lang``,
    ``glossary_id``): .txt or .html, translated in the background. Poll
    ``GET /translate/document/{id}``, then download ``/translate/document/{id}/result``."""

    def parse(body: bytes) -> PipelineRequest:
        return document_request(body, request.headers.get("content-type", ""),
                                state.settings, api="native", source="source_lang",
                                target="target_lang", glossary="glossary_id")

    job = await pipeline.start_document(state, request, parse,
                                        credentials.credentials if credentials else "")
    return DocumentAccepted(document_id=job.document_id, document_key=job.document_key,
                            status=job.status)


async def _document(request: Request, state: State, document_id: str, document_key: str,
                    ) -> DocumentJob:
    key = key_of(request)
    check_key(state, request, key)
    # Another key's document is "not found" (not 403): a key cannot even learn it exists.
    job = await state.documents.get(document_id, document_key, owner_of(state, key))
    if job is None:
        raise PipelineError("document_not_found", "Document not found (or not yours: give "
                            "its document_key).", "document_id")
    return job


@router.get("/translate/document/{document_id}", response_model=DocumentStatus,
            response_model_exclude_none=True, responses=_errors(401, 404))
async def document_status(request: Request, state: State, document_id: str,
                          document_key: str = "") -> DocumentStatus:
    """A document's translation status."""
    job = await _document(request, state, document_id, document_key)
    return DocumentStatus(document_id=job.document_id, status=job.status,
                          characters=job.characters, error=job.error)


@router.get("/translate/document/{document_id}/result", responses=_errors(401, 404, 409))
async def document_result(request: Request, state: State, document_id: str,
                          document_key: str = "") -> Response:
    """The translated document, once: it is deleted with its download."""
    job = await _document(request, state, document_id, document_key)
    if job.status != DONE:
        raise PipelineError("document_not_ready", f"The document is {job.status}, not done.",
                            "document_id", retry_after=1)
    data = await state.documents.take(job)
    if data is None:
        raise PipelineError("document_not_found", "Document not found.", "document_id")
    return download(job, data)


def _alternatives(found: list[tuple[str, float | None]] | None) -> list[Alternative] | None:
    return None if found is None else [Alternative(text=text, score=score)
                                       for text, score in found]


def _parse(body: bytes) -> PipelineRequest:
    """Parsed here rather than by FastAPI so that any content type is accepted (curl -d sends
    a form type) and invalid JSON and encodings get their own error codes."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PipelineError("invalid_encoding",
                            f"Body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        # A leading byte-order mark is tolerated, as RFC 8259 allows.
        payload = translate_request(text.removeprefix("\ufeff"))
    except ValidationError as exc:
        error = from_validation_errors(exc.errors())
        raise PipelineError(error.code, error.message, error.field) from None
    options = TranslateOptions(
        beam_size=payload.beam_size, max_length=payload.max_length,
        no_repeat_ngram_size=payload.no_repeat_ngram_size,
        length_penalty=payload.length_penalty, max_length_ratio=payload.max_length_ratio,
        num_alternatives=payload.num_alternatives, return_scores=payload.return_scores,
        format=payload.format, return_sentences=payload.return_sentences)
    single = isinstance(payload.text, str)
    if payload.glossary_id is not None and payload.glossary is not None:
        raise PipelineError("invalid_field", "Give glossary_id or glossary, not both.",
                            "glossary")
    return PipelineRequest([payload.text] if single else payload.text, options,
                           payload.source_lang, payload.target_lang, pivot=payload.pivot,
                           single=single, glossary_id=payload.glossary_id,
                           glossary=payload.glossary)
