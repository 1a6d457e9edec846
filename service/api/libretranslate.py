"""LibreTranslate's API under ``/libretranslate`` (a client's base URL is
``http://host:8000/libretranslate``): a thin adapter from its request and response shapes to
``Translator.translate``.

Field for field as LibreTranslate answers (its ``app.py``): ``POST /translate`` takes ``q`` (a
string or a list), ``source`` (a code or ``auto``), ``target``, ``format`` (``text`` or
``html``), ``alternatives`` and ``api_key`` from a JSON, form-encoded or query body, and
answers ``translatedText`` (a string or a list, as ``q`` was), ``alternatives`` when asked for
and ``detectedLanguage`` (``{confidence: 0-100, language}``, a list for a list) when the source
was ``auto``. Errors are ``{"error": message}`` with its status codes: 400 for a bad request,
403 for a wrong key, 429 ("Slowdown: ...") when the queue is full or a client over its limits.
Multipart bodies (file translation) are not supported. ``auto`` and ``/detect`` detect the
language among those the loaded bundles translate from (``service.detect``).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.api.fields import BadFields, CompatError, request_fields
from service.api.shared import (
    ServiceState,
    check_texts,
    request_id_of,
    require_ready,
    scheduler_error,
    take_rate,
    unless_disconnected,
)
from service.errors import ApiError
from service.scheduler import SchedulerError
from service.translator import InvalidOption, Pair, TranslateOptions, fixed_options

router = APIRouter(prefix="/libretranslate", tags=["LibreTranslate-compatible"])

# English names of the languages bundles commonly serve; any other code names itself.
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish",
    "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian",
    "fi": "Finnish", "fr": "French", "ga": "Irish", "he": "Hebrew", "hi": "Hindi",
    "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sv": "Swedish",
    "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}


class LibreTranslateError(CompatError):
    """An answer in LibreTranslate's error shape."""

    field = "error"


def _from_api_error(exc: ApiError) -> LibreTranslateError:
    """Our own refusals in LibreTranslate's words and codes."""
    if exc.status == 429:
        return LibreTranslateError(429, f"Slowdown: {exc.message}", exc.headers)
    status = 400 if exc.status in (413, 422) else exc.status
    return LibreTranslateError(status, exc.message, exc.headers)


async def _fields(request: Request, state: ServiceState) -> dict[str, Any]:
    try:
        return await request_fields(request, state.settings, repeated="q")
    except BadFields as exc:
        raise LibreTranslateError(400, str(exc)) from None


def _check_key(state: ServiceState, fields: dict[str, Any]) -> str:
    """The body's ``api_key``, checked against API_KEYS when set: whom the rate limits count."""
    keys = state.settings.api_keys
    given = str(fields.get("api_key") or "")
    if not keys:
        return given
    if not given:
        raise LibreTranslateError(400, "Please contact the server operator to get an API key")
    if not any([hmac.compare_digest(given.encode(), key.encode()) for key in keys]):
        raise LibreTranslateError(403, "Invalid API key")
    return given


def _name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def _detect(state: ServiceState, texts: Sequence[str], candidates: list[str],
            ) -> tuple[str, float]:
    """(language, confidence 0-100) among ``candidates``; text with no letters gets the first
    candidate with confidence 0, as LibreTranslate answers it."""
    ranked = state.detect_languages(texts, candidates)
    if not ranked:
        return candidates[0], 0.0
    language, confidence = ranked[0]
    return language, round(100 * confidence, 2)


def _pair(state: ServiceState, source: str, target: str, texts: Sequence[str],
          ) -> tuple[Pair, dict[str, Any] | None]:
    """The loaded pair a request means and, for ``auto``, LibreTranslate's detectedLanguage."""
    target = target.strip().lower()
    sources = sorted({s for s, t in state.engines if t == target})
    if not sources:
        raise LibreTranslateError(400, f"{target} is not supported")
    if source.strip().lower() == "auto":
        language, confidence = _detect(state, texts, sources)
        return (language, target), {"confidence": confidence, "language": language}
    source = source.strip().lower()
    if (source, target) not in state.engines:
        if not any(s == source for s, _ in state.engines):
            raise LibreTranslateError(400, f"{source} is not supported")
        raise LibreTranslateError(400, f"{target} is not available as a target language "
                                       f"from {source}")
    return (source, target), None


@router.post("/translate")
async def translate(request: Request) -> JSONResponse:
    """LibreTranslate's ``POST /translate``."""
    state: ServiceState = request.app.state.service
    try:
        return await _translate(request, state)
    except LibreTranslateError as exc:
        return exc.response()
    except ApiError as exc:
        return _from_api_error(exc).response()


async def _translate(request: Request, state: ServiceState) -> JSONResponse:
    deadline = asyncio.get_running_loop().time() + state.settings.request_timeout_s
    fields = await _fields(request, state)
    api_key = _check_key(state, fields)
    q = fields.get("q")
    for name in ("q", "source", "target"):
        if not fields.get(name):
            raise LibreTranslateError(400, f"Invalid request: missing {name} parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(text, str) for text in texts):
        raise LibreTranslateError(400, "Invalid request: q must be a string or a list of "
                                       "strings")
    text_format = fields.get("format") or "text"
    if text_format not in ("text", "html"):
        raise LibreTranslateError(400, f"{text_format} format is not supported")
    try:
        alternatives = max(0, int(fields.get("alternatives") or 0))
    except (TypeError, ValueError):
        raise LibreTranslateError(
            400, "Invalid request: alternatives parameter is not a number") from None
    settings = state.settings
    check_texts(texts, not batch, settings)
    options = TranslateOptions(num_alternatives=alternatives, format=text_format)
    try:
        fixed_options(options, settings)
    except InvalidOption as exc:
        raise LibreTranslateError(400, f"Invalid request: {exc}") from None
    require_ready(state)
    pair, detected = _pair(state, str(fields["source"]), str(fields["target"]), texts)
    take_rate(state, request, sum(map(len, texts)), api_key)
    assert state.translator is not None  # ready implies a translator
    work = state.translator.translate(texts, pair, options, deadline=deadline,
                                      request_id=request_id_of(request))
    try:
        results = await unless_disconnected(request, work)
    except SchedulerError as exc:
        raise _from_api_error(scheduler_error(exc)) from None
    translated = [result.text for result in results]
    others = [[text for text, _ in result.alternatives or [] if text != result.text]
              for result in results]
    answer: dict[str, Any] = {"translatedText": translated if batch else translated[0]}
    if detected is not None:
        answer["detectedLanguage"] = [detected] * len(texts) if batch else detected
    if alternatives:
        answer["alternatives"] = others if batch else others[0]
    return JSONResponse(answer)


@router.get("/languages")
async def languages(request: Request) -> JSONResponse:
    """LibreTranslate's ``GET /languages``: ``[{code, name, targets}]``."""
    state: ServiceState = request.app.state.service
    targets: dict[str, list[str]] = {}
    for source, target in sorted(state.engines):
        targets.setdefault(source, []).append(target)
    return JSONResponse([{"code": code, "name": _name(code), "targets": reached}
                         for code, reached in targets.items()])


@router.post("/detect")
async def detect(request: Request) -> JSONResponse:
    """LibreTranslate's ``POST /detect``: ``[{confidence (0-100), language}]``, best first,
    among the languages the loaded bundles translate from."""
    state: ServiceState = request.app.state.service
    try:
        fields = await _fields(request, state)
        _check_key(state, fields)
        q = fields.get("q")
        if not q:
            raise LibreTranslateError(400, "Invalid request: missing q parameter")
        texts = q if isinstance(q, list) else [q]
        require_ready(state)
        candidates = sorted({source for source, _ in state.engines})
        ranked = state.detect_languages(texts, candidates) or [(candidates[0], 0.0)]
        return JSONResponse([{"confidence": round(100 * confidence, 2), "language": language}
                             for language, confidence in ranked])
    except LibreTranslateError as exc:
        return exc.response()
    except ApiError as exc:
        return _from_api_error(exc).response()


@router.get("/frontend/settings")
async def frontend_settings(request: Request) -> JSONResponse:
    """LibreTranslate's ``GET /frontend/settings``, which its web UI and some clients read."""
    state: ServiceState = request.app.state.service
    settings = state.settings
    source, target = min(state.engines, default=("en", "de"))
    return JSONResponse({
        "charLimit": settings.max_chars,
        "frontendTimeout": 500,
        "apiKeys": bool(settings.api_keys),
        "keyRequired": bool(settings.api_keys),
        "suggestions": False,
        "filesTranslation": False,
        "supportedFilesFormat": [],
        "language": {
            "source": {"code": source, "name": _name(source)},
            "target": {"code": target, "name": _name(target)},
        },
    })
