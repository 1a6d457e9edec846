"""LibreTranslate's API under ``/libretranslate`` (a client's base URL is
``http://host:8000/libretranslate``): its request shapes parsed into the pipeline's request
(``service.pipeline``), its answers and error shape rendered, nothing else.

Field for field as LibreTranslate answers (its ``app.py``): ``POST /translate`` takes ``q`` (a
string or a list), ``source`` (a code or ``auto``), ``target``, ``format`` (``text`` or
``html``), ``alternatives`` and ``api_key`` from a JSON, form-encoded or query body, and
answers ``translatedText`` (a string or a list, as ``q`` was), ``alternatives`` when asked for
and ``detectedLanguage`` (``{confidence: 0-100, language}``, a list for a list) when the source
was ``auto``. Errors are ``{"error": message}`` with its status codes (``LIBRETRANSLATE``): 400
for a bad request, 403 for a wrong key, 429 ("Slowdown: ...") when the queue is full or a
client over its limits. Multipart bodies (file translation) are not supported. ``auto`` and
``/detect`` detect the language among those the loaded bundles translate from
(``service.detect``).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service import pipeline
from service.api.fields import compat_fields, text_list
from service.api.replies import MALFORMED, SERVICE_SIDE, Reply, message_shape
from service.api.uploads import document_request, download, form_key, translated_name
from service.documents import DONE, extensions
from service.errors import ShapedRoute
from service.languages import language_name
from service.pipeline import PipelineError, PipelineRequest, keyed_body, require_ready
from service.state import ServiceState
from service.translator import TranslateOptions

PREFIX = "/libretranslate"

_SLOWDOWN = "Slowdown: {message}"
_INVALID = Reply(400, "Invalid request: {message}")
LIBRETRANSLATE: dict[str, Reply] = {
    **dict.fromkeys(MALFORMED, _INVALID),
    "invalid_field": Reply(400),
    "missing_key": Reply(400, "Please contact the server operator to get an API key"),
    "invalid_key": Reply(403, "Invalid API key"),
    "too_many_failed_keys": Reply(429, _SLOWDOWN),
    "body_too_large": Reply(413),
    **dict.fromkeys(("too_many_texts", "text_too_long", "too_many_characters",
                     "too_many_sentences", "over_rate_limit"), _INVALID),
    "unsupported_language_pair": Reply(400, "{value} is not supported"),
    "ambiguous_language_pair": Reply(400),
    "rate_limited": Reply(429, _SLOWDOWN),
    "queue_full": Reply(429, _SLOWDOWN),
    "quota_exceeded": Reply(403),
    "invalid_document": Reply(400),
    "document_too_large": Reply(413),
    "document_not_found": Reply(404),
    "glossary_not_found": Reply(404),
    **SERVICE_SIDE,
}


class LibreTranslateRoute(ShapedRoute):
    error_shape = message_shape(LIBRETRANSLATE, "error")


router = APIRouter(prefix=PREFIX, tags=["LibreTranslate-compatible"],
                   route_class=LibreTranslateRoute)


def _body_key(fields: dict[str, Any]) -> str:
    """LibreTranslate's ``api_key`` field."""
    return str(fields.get("api_key") or "")


def _translate_request(fields: dict[str, Any]) -> PipelineRequest:
    for name in ("q", "source", "target"):
        if not fields.get(name):
            raise PipelineError("missing_field", f"missing {name} parameter", name)
    q = fields["q"]
    texts = text_list(q, "q")
    text_format = str(fields.get("format") or "text")
    if text_format not in ("text", "html"):
        raise PipelineError("invalid_field", f"{text_format} format is not supported", "format")
    try:
        alternatives = max(0, int(fields.get("alternatives") or 0))
    except (TypeError, ValueError):
        raise PipelineError("invalid_field", "Invalid request: alternatives parameter is not "
                            "a number", "alternatives") from None
    source = str(fields["source"])
    return PipelineRequest(
        texts, TranslateOptions(num_alternatives=alternatives, format=text_format),
        source=source, target=str(fields["target"]), detect=source.strip().lower() == "auto",
        key=_body_key(fields), single=not isinstance(q, list))


@router.post("/translate")
async def translate(request: Request) -> JSONResponse:
    """LibreTranslate's ``POST /translate``."""
    state: ServiceState = request.app.state.service

    def parse(body: bytes) -> PipelineRequest:
        return _translate_request(compat_fields(body, request.headers, request.query_params,
                                                "q"))

    answer = await pipeline.translate(state, request, parse)
    batch = not answer.request.single
    translated = [result.text for result in answer.results]
    body: dict[str, Any] = {"translatedText": translated if batch else translated[0]}
    if answer.detected is not None:
        language, confidence = answer.detected
        detected = {"confidence": round(100 * confidence, 2), "language": language}
        body["detectedLanguage"] = [detected] * len(translated) if batch else detected
    if any(result.alternatives is not None for result in answer.results):
        others = [[text for text, _ in result.alternatives or [] if text != result.text]
                  for result in answer.results]
        body["alternatives"] = others if batch else others[0]
    return JSONResponse(body)


@router.post("/translate_file")
async def translate_file(request: Request) -> Response:
    """LibreTranslate's ``POST /translate_file`` (multipart: ``file``, ``source``, ``target``,
    ``api_key``): answers, once translated, ``translatedFileUrl``, where the file can be
    downloaded once (``/download_file/...``). Formats: ``service.documents``."""
    state: ServiceState = request.app.state.service

    def parse(body: bytes) -> PipelineRequest:
        return document_request(body, request.headers.get("content-type", ""),
                                state.settings, api="libretranslate", source="source",
                                target="target", key="api_key")

    job = await pipeline.start_document(state, request, parse, None, key_first=lambda body: (
        form_key(body, request.headers.get("content-type", ""), "api_key")), linked=True)
    assert job.task is not None
    await asyncio.shield(job.task)  # LibreTranslate answers once the file is translated
    if job.status != DONE:
        raise PipelineError("translation_failed", job.error or "failed")
    name = quote(translated_name(job.filename))
    url = f"{str(request.base_url).rstrip('/')}{PREFIX}/download_file/{job.document_id}/" \
          f"{job.document_key}/{name}"
    return JSONResponse({"translatedFileUrl": url})


@router.get("/download_file/{document_id}/{document_key}/{filename}")
async def download_file(request: Request, document_id: str, document_key: str,
                        filename: str) -> Response:
    """A file ``/translate_file`` translated, once, to whoever holds its URL: LibreTranslate's
    clients fetch it without a key, so the URL holds the document's key (256 random bits),
    and serves only files uploaded here, never one uploaded through another API, whose
    owner's key is asked for."""
    state: ServiceState = request.app.state.service
    job = await state.documents.linked(document_id, document_key)
    data = await state.documents.take(job) if job is not None and job.status == DONE else None
    if job is None or data is None:
        raise PipelineError("document_not_found", "File not found.")
    return download(job, data)


@router.get("/languages")
async def languages(request: Request) -> JSONResponse:
    """LibreTranslate's ``GET /languages``: ``[{code, name, targets}]``, the targets reached
    through English included, as LibreTranslate lists them."""
    state: ServiceState = request.app.state.service
    targets: dict[str, list[str]] = {}
    for source, target in sorted([*state.pairs, *state.pivots]):
        targets.setdefault(source, []).append(target)
    return JSONResponse([{"code": code, "name": language_name(code), "targets": reached}
                         for code, reached in targets.items()])


@router.post("/detect")
async def detect(request: Request) -> JSONResponse:
    """LibreTranslate's ``POST /detect``: ``[{confidence (0-100), language}]``, best first,
    among the languages the loaded bundles translate from."""
    state: ServiceState = request.app.state.service
    fields, _ = await keyed_body(
        state, request, lambda body: compat_fields(body, request.headers,
                                                   request.query_params, "q"),
        None, _body_key)
    if not fields.get("q"):
        raise PipelineError("missing_field", "missing q parameter", "q")
    texts = text_list(fields["q"], "q")
    require_ready(state)
    candidates = sorted({source for source, _ in state.pairs})
    ranked = state.detect_languages(texts, candidates) or [(candidates[0], 0.0)]
    return JSONResponse([{"confidence": round(100 * confidence, 2), "language": language}
                         for language, confidence in ranked])


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """LibreTranslate's ``GET /health``: 200 ``{"status": "ok"}`` while the process serves."""
    state: ServiceState = request.app.state.service
    if state.phase == "failed":
        raise PipelineError("load_failed", "Loading the models failed.")
    return JSONResponse({"status": "ok"})


@router.get("/spec")
async def spec(request: Request) -> JSONResponse:
    """LibreTranslate's ``GET /spec``: an OpenAPI description of the API; here the service's
    whole OpenAPI document, in which these routes are tagged LibreTranslate-compatible."""
    return JSONResponse(request.app.openapi())


@router.get("/frontend/settings")
async def frontend_settings(request: Request) -> JSONResponse:
    """LibreTranslate's ``GET /frontend/settings``, which its web UI and some clients read."""
    state: ServiceState = request.app.state.service
    settings = state.settings
    source, target = min(state.pairs, default=("en", "de"))
    return JSONResponse({
        "charLimit": settings.max_chars,
        "frontendTimeout": 500,
        "apiKeys": state.keys.required,
        "keyRequired": state.keys.required,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": extensions("libretranslate"),
        "language": {
            "source": {"code": source, "name": language_name(source)},
            "target": {"code": target, "name": language_name(target)},
        },
    })
