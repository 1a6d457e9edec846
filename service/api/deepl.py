"""DeepL's API v2 under ``/v2`` (a client's ``server_url`` is ``http://host:8000``): its request
shapes parsed into the pipeline's request (``service.pipeline``), its answers and error shape
rendered, nothing else.

As DeepL's clients send and parse them: ``POST /v2/translate`` takes ``text`` (a list, or a
repeated form field), ``target_lang`` and ``source_lang`` (case-insensitive, regional variants
such as ``EN-US`` or ``PT-BR`` served by the language's model; a missing ``source_lang`` is
detected among the loaded languages), ``split_sentences``, ``preserve_formatting``,
``tag_handling``, ``formality`` and ``model_type``, from a JSON or form body; it answers
``translations``, each with ``detected_source_language``, ``text``, ``billed_characters`` (the
official client fails without it) and ``model_type_used`` when ``model_type`` was given.
``GET|POST /v2/languages?type=source|target`` (``type`` also from a form body) and
``GET /v2/usage``. The key comes as ``Authorization: DeepL-Auth-Key KEY`` (or a legacy
``auth_key`` field) and is checked against ``API_KEYS`` when set. Errors are ``{"message":
...}`` with DeepL's codes (``DEEPL``): 400, 403 (key), 413 (size), 429 with Retry-After, 456
(``USAGE_LIMIT_CHARS`` spent).

What is accepted but has no effect: ``split_sentences`` (the model translates sentence by
sentence, so text is always split; ``0`` does not keep a text whole), ``preserve_formatting``
(whitespace and layout are always kept), ``context``, ``formality`` ``prefer_more``/
``prefer_less`` and ``default`` (no loaded model has a formality setting: ``more``/``less`` are
refused, as DeepL refuses them for a language without one), and ``model_type`` (each pair has
one model, which serves every type; ``model_type_used`` names the type asked for). A
``glossary_id`` applies the caller's glossary (``service.api.deepl_glossaries``; it needs
``source_lang``); ``custom_instructions`` or ``style_id`` is refused (``UNSUPPORTED``).
``tag_handling`` ``html`` and ``xml`` keep the markup (``service.markup``), and
``ignore_tags`` names elements whose text is left as it is (kept in their sentence);
``non_splitting_tags`` and ``splitting_tags`` are not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service import pipeline
from service.api.fields import compat_fields, text_list
from service.api.replies import MALFORMED, SERVICE_SIDE, Reply, message_shape
from service.errors import ShapedRoute
from service.languages import language_name
from service.pipeline import PipelineError, PipelineRequest, client_of, keyed_body
from service.state import ServiceState
from service.translator import TranslateOptions

PREFIX = "/v2"
FORMALITIES = ("default", "more", "less", "prefer_more", "prefer_less")
SPLIT_SENTENCES = ("0", "1", "nonewlines")
MODEL_TYPES = ("quality_optimized", "latency_optimized", "prefer_quality_optimized")
BOOLEANS = ("0", "1", "true", "false")
# Fields that would change a translation in ways no loaded model can: refused, not ignored.
UNSUPPORTED = ("custom_instructions", "style_id")
# /v2/usage's limit when USAGE_LIMIT_CHARS is 0: DeepL's clients count a limit of 0 as
# reached, and DeepL itself reports this figure for an account without a cap.
NO_LIMIT = 1_000_000_000_000

_SIZE = Reply(413)
DEEPL: dict[str, Reply] = {
    **{code: Reply(400) for code in MALFORMED},
    "missing_key": Reply(403, "Authorization failure, check auth_key"),
    "invalid_key": Reply(403, "Authorization failure, check auth_key"),
    "too_many_failed_keys": Reply(429, "Too many requests: {message}"),
    **{code: _SIZE for code in ("body_too_large", "too_many_texts", "text_too_long",
                                "too_many_characters", "too_many_sentences", "over_rate_limit")},
    "unsupported_language_pair": Reply(400, "Value for '{field}' not supported."),
    "ambiguous_language_pair": Reply(400),
    "rate_limited": Reply(429, "Too many requests: {message}"),
    "queue_full": Reply(429, "Too many requests: {message}"),
    "quota_exceeded": Reply(456, "Quota exceeded"),
    "glossary_not_found": Reply(404, "Glossary not found"),
    "too_many_glossary_entries": Reply(413),
    "too_many_glossaries": Reply(403, "Too many glossaries: {message}"),
    "invalid_document": Reply(400),
    "document_too_large": Reply(413),
    "document_not_found": Reply(404, "Document not found"),
    "document_not_ready": Reply(503),
    **SERVICE_SIDE,
}


class DeepLRoute(ShapedRoute):
    error_shape = message_shape(DEEPL, "message")


router = APIRouter(prefix=PREFIX, tags=["DeepL-compatible"], route_class=DeepLRoute)


@dataclass(frozen=True)
class DeepLRequest(PipelineRequest):
    """The pipeline's request, and the ``model_type`` DeepL's answer names as used."""

    model_type: str = ""


def header_key(request: Request) -> str | None:
    """The key of an ``Authorization: DeepL-Auth-Key KEY`` header; None when the request has
    none (the key may then come as a legacy ``auth_key`` field)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "deepl-auth-key" else None


def language_code(code: str) -> str:
    """DeepL's code (``EN-US``, ``pt-br``) as the loaded pairs spell it (``en``, ``pt``)."""
    return code.strip().lower().split("-")[0]


def _choice(fields: dict[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    """A field of a few values (JSON numbers and booleans as forms spell them), or a 400."""
    value = fields.get(name)
    text = str(value).lower() if not isinstance(value, bool) else str(int(value))
    if value is not None and text not in allowed:
        raise PipelineError("invalid_field", f"Value for '{name}' not supported.", name)
    return text if value is not None else ""


def check_formality(fields: dict[str, Any]) -> None:
    """``formality``: more and less are refused (no loaded model has the setting), as DeepL
    refuses them for a language without one; the others change nothing."""
    if _choice(fields, "formality", FORMALITIES) in ("more", "less"):
        raise PipelineError("invalid_field", "Target language does not support the "
                            "'formality' setting.", "formality")


def _tags(value: Any) -> tuple[str, ...]:
    """Tag names from a list (the clients' JSON) or comma-separated strings (forms)."""
    values = value if isinstance(value, list) else [value] if value else []
    if not all(isinstance(v, str) for v in values):
        raise PipelineError("invalid_field",
                            "Value for 'ignore_tags' not supported: a list of tag names.",
                            "ignore_tags")
    return tuple(tag.strip() for v in values for tag in v.split(",") if tag.strip())


def _translate_request(fields: dict[str, Any]) -> DeepLRequest:
    if not fields.get("text"):
        raise PipelineError("missing_field",
                            "Parameter 'text' not specified or not a list of strings", "text")
    texts = text_list(fields["text"], "text")
    if not fields.get("target_lang"):
        raise PipelineError("missing_field", "Value for 'target_lang' not supported.",
                            "target_lang")
    tag_handling = _choice(fields, "tag_handling", ("html", "xml"))
    check_formality(fields)
    _choice(fields, "split_sentences", SPLIT_SENTENCES)
    _choice(fields, "preserve_formatting", BOOLEANS)
    _choice(fields, "model_type", MODEL_TYPES)
    for name in UNSUPPORTED:
        if fields.get(name):
            raise PipelineError("invalid_field", f"'{name}' is not supported by this server.",
                                name)
    # XML fragments are read by the same forgiving parser: tags and text kept as sent.
    options = TranslateOptions(format="html" if tag_handling else "text",
                               ignore_tags=_tags(fields.get("ignore_tags")) if tag_handling
                               else ())
    source = fields.get("source_lang")
    glossary_id = fields.get("glossary_id")
    if glossary_id is not None and not source:
        raise PipelineError("missing_field", "Value for 'source_lang' is required when using "
                            "a glossary.", "source_lang")
    return DeepLRequest(
        texts, options, source=language_code(str(source)) if source else None,
        target=language_code(str(fields["target_lang"])), detect=not source,
        key=_body_key(fields), glossary_id=str(glossary_id) if glossary_id else None,
        model_type=str(fields.get("model_type") or "").removeprefix("prefer_"))


@router.post("/translate")
async def translate(request: Request) -> JSONResponse:
    """DeepL's ``POST /v2/translate``."""
    state: ServiceState = request.app.state.service

    def parse(body: bytes) -> DeepLRequest:
        return _translate_request(compat_fields(body, request.headers, request.query_params,
                                                "text"))

    answer = await pipeline.translate(state, request, parse, key=header_key(request))
    translations = []
    for text, result in zip(answer.request.texts, answer.results, strict=True):
        translation = {"detected_source_language": answer.pair[0].upper(), "text": result.text,
                       "billed_characters": len(text)}
        if answer.request.model_type:
            translation["model_type_used"] = answer.request.model_type
        translations.append(translation)
    return JSONResponse({"translations": translations})


async def key_fields(request: Request, state: ServiceState) -> tuple[dict[str, Any], str]:
    """A GET or POST request's fields and its key, checked."""
    return await keyed_body(
        state, request, lambda body: compat_fields(body, request.headers,
                                                   request.query_params, "text"),
        header_key(request), _body_key)


def _body_key(fields: dict[str, Any]) -> str:
    """The legacy ``auth_key`` field."""
    return str(fields.get("auth_key") or "").strip()


async def languages(request: Request) -> JSONResponse:
    """DeepL's ``/v2/languages``: ``[{language, name}]`` for ``type=source`` (the default),
    with ``supports_formality`` for ``type=target``."""
    state: ServiceState = request.app.state.service
    fields, _ = await key_fields(request, state)
    kind = str(fields.get("type") or "source").lower()
    if kind not in ("source", "target"):
        raise PipelineError("invalid_field", "Value for 'type' not supported.", "type")
    codes = sorted({pair[0 if kind == "source" else 1] for pair in state.pairs})
    entries: list[dict[str, Any]] = []
    for code in codes:
        entry: dict[str, Any] = {"language": code.upper(), "name": language_name(code)}
        if kind == "target":
            entry["supports_formality"] = False
        entries.append(entry)
    return JSONResponse(entries)


async def usage(request: Request) -> JSONResponse:
    """DeepL's ``/v2/usage``: characters this client translated since the process started,
    and its ``USAGE_LIMIT_CHARS`` (``NO_LIMIT`` when there is none)."""
    state: ServiceState = request.app.state.service
    _, key = await key_fields(request, state)
    client = client_of(state, request, key)
    return JSONResponse({"character_count": await state.usage.count(client),
                         "character_limit": state.settings.usage_limit_chars or NO_LIMIT})


# DeepL answers both methods; one route per method, so each has its own OpenAPI operation id
# (FastAPI gives one api_route with two methods the same id twice).
for _method in ("GET", "POST"):
    router.add_api_route("/languages", languages, methods=[_method],
                         operation_id=f"deepl_languages_{_method.lower()}")
    router.add_api_route("/usage", usage, methods=[_method],
                         operation_id=f"deepl_usage_{_method.lower()}")
