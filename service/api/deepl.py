"""DeepL's API v2 under ``/v2`` (a client's ``server_url`` is ``http://host:8000``): a thin
adapter from its request and response shapes to ``Translator.translate``.

As DeepL's clients send and parse them: ``POST /v2/translate`` takes ``text`` (a list, or a
repeated form field), ``target_lang`` and ``source_lang`` (case-insensitive, regional variants
such as ``EN-US`` or ``PT-BR`` served by the language's model; a missing ``source_lang`` is
detected among the loaded languages), ``split_sentences``, ``preserve_formatting``,
``tag_handling`` and ``formality``, from a JSON or form body; it answers ``translations``, each
with ``detected_source_language``, ``text`` and ``billed_characters`` (the official client
fails without it). ``GET|POST /v2/languages?type=source|target`` (``type`` also from a form
body) and ``GET /v2/usage``. The key comes as ``Authorization: DeepL-Auth-Key KEY`` (or a
legacy ``auth_key`` field) and is checked against ``API_KEYS`` when set. Errors are
``{"message": ...}`` with DeepL's codes: 400, 403 (key), 413 (size), 429 with Retry-After, 456
(``USAGE_LIMIT_CHARS`` spent).

What is accepted but has no effect: ``split_sentences`` (the model translates sentence by
sentence, so text is always split; ``0`` does not keep a text whole), ``preserve_formatting``
(whitespace and layout are always kept), ``formality`` ``prefer_more``/``prefer_less`` and
``default`` (no loaded model has a formality setting: ``more``/``less`` are refused, as DeepL
refuses them for a language without one). ``tag_handling`` ``html`` and ``xml`` keep the markup
(``service.markup``), and ``ignore_tags`` names elements whose text is left as it is (kept in
their sentence); ``non_splitting_tags`` and ``splitting_tags`` are not read.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.api.fields import BadFields, CompatError, request_fields
from service.api.libretranslate import LANGUAGE_NAMES
from service.api.shared import (
    ServiceState,
    check_texts,
    client_key,
    request_id_of,
    require_ready,
    scheduler_error,
    take_rate,
    unless_disconnected,
)
from service.errors import ApiError
from service.scheduler import SchedulerError
from service.translator import InvalidOption, TranslateOptions, fixed_options

router = APIRouter(prefix="/v2", tags=["DeepL-compatible"])
FORMALITIES = ("default", "more", "less", "prefer_more", "prefer_less")
QUOTA_EXCEEDED = 456  # DeepL's status for a spent character quota


class DeepLError(CompatError):
    """An answer in DeepL's error shape."""

    field = "message"


def _from_api_error(exc: ApiError) -> DeepLError:
    status = 400 if exc.status == 422 else exc.status
    return DeepLError(status, exc.message, exc.headers)


async def _fields(request: Request, state: ServiceState) -> dict[str, Any]:
    try:
        return await request_fields(request, state.settings, repeated="text")
    except BadFields as exc:
        raise DeepLError(400, str(exc)) from None


def _check_key(request: Request, state: ServiceState, fields: dict[str, Any]) -> str:
    """The key given (``DeepL-Auth-Key`` header or ``auth_key`` field), checked against
    API_KEYS when set: whom the rate limits and usage count."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "deepl-auth-key":
        given = str(fields.get("auth_key") or "")
    given = given.strip()
    keys = state.settings.api_keys
    if keys and not any([hmac.compare_digest(given.encode(), key.encode()) for key in keys]):
        raise DeepLError(403, "Authorization failure, check auth_key")
    return given


def _language(code: str) -> str:
    """DeepL's code (``EN-US``, ``pt-br``) as the loaded pairs spell it (``en``, ``pt``)."""
    return code.strip().lower().split("-")[0]


@router.post("/translate")
async def translate(request: Request) -> JSONResponse:
    """DeepL's ``POST /v2/translate``."""
    state: ServiceState = request.app.state.service
    try:
        return await _translate(request, state)
    except DeepLError as exc:
        return exc.response()
    except ApiError as exc:
        return _from_api_error(exc).response()


def _tags(value: Any) -> tuple[str, ...]:
    """Tag names from a list (the clients' JSON) or comma-separated strings (forms)."""
    values = value if isinstance(value, list) else [value] if value else []
    if not all(isinstance(v, str) for v in values):
        raise DeepLError(400, "Value for 'ignore_tags' not supported: a list of tag names.")
    return tuple(tag.strip() for v in values for tag in v.split(",") if tag.strip())


async def _translate(request: Request, state: ServiceState) -> JSONResponse:
    deadline = asyncio.get_running_loop().time() + state.settings.request_timeout_s
    fields = await _fields(request, state)
    api_key = _check_key(request, state, fields)
    texts = fields.get("text")
    if isinstance(texts, str):
        texts = [texts]
    if not texts or not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise DeepLError(400, "Parameter 'text' not specified or not a list of strings")
    if not fields.get("target_lang"):
        raise DeepLError(400, "Value for 'target_lang' not supported.")
    tag_handling = str(fields.get("tag_handling") or "")
    if tag_handling not in ("", "html", "xml"):
        raise DeepLError(400, f"Value for 'tag_handling' not supported: {tag_handling}")
    formality = str(fields.get("formality") or "default").lower()
    if formality not in FORMALITIES:
        raise DeepLError(400, f"Value for 'formality' not supported: {formality}")
    if formality in ("more", "less"):
        raise DeepLError(400, "'formality' is not supported for given 'target_lang'.")
    settings = state.settings
    try:
        check_texts(texts, False, settings)
    except ApiError as exc:
        raise DeepLError(413, exc.message) from None
    # XML fragments are read by the same forgiving parser: tags and text kept as sent.
    options = TranslateOptions(format="html" if tag_handling else "text",
                               ignore_tags=_tags(fields.get("ignore_tags")) if tag_handling else ())
    try:
        fixed_options(options, settings)
    except InvalidOption as exc:
        raise DeepLError(400, str(exc)) from None
    require_ready(state)
    target = _language(str(fields["target_lang"]))
    sources = sorted({s for s, t in state.engines if t == target})
    if not sources:
        raise DeepLError(400, "Value for 'target_lang' not supported.")
    if fields.get("source_lang"):
        source = _language(str(fields["source_lang"]))
        if source not in sources:
            raise DeepLError(400, "Value for 'source_lang' not supported.")
    else:
        ranked = state.detect_languages(texts, sources) if len(sources) > 1 else []
        source = ranked[0][0] if ranked else sources[0]
    characters = sum(map(len, texts))
    client = client_key(request, state.settings, api_key)
    limit = settings.usage_limit_chars
    if limit and state.usage.count(client) + characters > limit:
        raise DeepLError(QUOTA_EXCEEDED, "Quota exceeded")
    take_rate(state, request, characters, api_key)
    assert state.translator is not None  # ready implies a translator
    work = state.translator.translate(texts, (source, target), options, deadline=deadline,
                                      request_id=request_id_of(request))
    try:
        results = await unless_disconnected(request, work)
    except SchedulerError as exc:
        raise _from_api_error(scheduler_error(exc)) from None
    state.usage.add(client, characters)
    return JSONResponse({"translations": [
        {"detected_source_language": source.upper(), "text": result.text,
         "billed_characters": len(text)}
        for text, result in zip(texts, results, strict=True)
    ]})


async def languages(request: Request) -> JSONResponse:
    """DeepL's ``/v2/languages``: ``[{language, name}]`` for ``type=source`` (the default),
    with ``supports_formality`` for ``type=target``."""
    state: ServiceState = request.app.state.service
    try:
        fields = await _fields(request, state)
        _check_key(request, state, fields)
    except DeepLError as exc:
        return exc.response()
    kind = str(fields.get("type") or "source").lower()
    if kind not in ("source", "target"):
        return DeepLError(400, "Value for 'type' not supported.").response()
    codes = sorted({pair[0 if kind == "source" else 1] for pair in state.engines})
    entries: list[dict[str, Any]] = []
    for code in codes:
        entry: dict[str, Any] = {"language": code.upper(), "name": LANGUAGE_NAMES.get(code, code)}
        if kind == "target":
            entry["supports_formality"] = False
        entries.append(entry)
    return JSONResponse(entries)


async def usage(request: Request) -> JSONResponse:
    """DeepL's ``/v2/usage``: characters this client translated since the process started,
    and its ``USAGE_LIMIT_CHARS`` (absent when there is none)."""
    state: ServiceState = request.app.state.service
    try:
        api_key = _check_key(request, state, await _fields(request, state))
    except DeepLError as exc:
        return exc.response()
    client = client_key(request, state.settings, api_key)
    answer: dict[str, int] = {"character_count": state.usage.count(client)}
    if state.settings.usage_limit_chars:
        answer["character_limit"] = state.settings.usage_limit_chars
    return JSONResponse(answer)


# DeepL answers both methods; one route per method, so each has its own OpenAPI operation id
# (FastAPI gives one api_route with two methods the same id twice).
for _method in ("GET", "POST"):
    router.add_api_route("/languages", languages, methods=[_method],
                         operation_id=f"deepl_languages_{_method.lower()}")
    router.add_api_route("/usage", usage, methods=[_method],
                         operation_id=f"deepl_usage_{_method.lower()}")
