"""Request and response bodies.

Requests are strict (no "4" for 4, no true for 1) and closed (unknown fields are errors): a typo
such as ``beamsize`` must fail loudly rather than be ignored. Limits that depend on settings
(``MAX_BEAM``, ``MAX_CHARS``, ...) are checked in the route, where the settings are.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class TranslateRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"text": "Hello world.", "source_lang": "en", "target_lang": "de"},
                {"text": ["First text.", "Second one."], "beam_size": 4, "num_alternatives": 2},
            ]
        },
    )

    text: str | list[str] = Field(
        description="A text or a list of texts; each may hold several sentences and paragraphs."
    )
    source_lang: str | None = Field(
        None, min_length=1, max_length=16, description="Source language; default: inferred."
    )
    target_lang: str | None = Field(
        None, min_length=1, max_length=16, description="Target language; default: inferred."
    )
    beam_size: int | None = Field(
        None,
        ge=1,
        description="Beam width; 1 is greedy decoding. Default: the server's DEFAULT_BEAM "
        "(2 unless set).",
    )
    max_length: int | None = Field(
        None, ge=1, description="Most target tokens generated per sentence."
    )
    no_repeat_ngram_size: int | None = Field(
        None,
        ge=0,
        le=64,
        description="Never repeat an n-gram of this many tokens in a translation (0: allow; "
        "default: the server's NO_REPEAT_NGRAM_SIZE).",
    )
    length_penalty: float | None = Field(
        None,
        ge=0,
        le=4,
        description="Beam hypotheses are ranked by log-probability / length ** this; above 1 "
        "favours longer translations. Default: the model's recommendation (its manifest).",
    )
    max_length_ratio: float | None = Field(
        None,
        gt=0,
        le=16,
        description="Most target tokens per sentence as a multiple of its source tokens (+ 10), "
        "besides max_length. Default: the model's recommendation, else 2.",
    )
    num_alternatives: int = Field(
        0, ge=0, description="Extra translations besides the best; needs beam_size > this."
    )
    return_scores: bool = Field(
        False, description="Include each translation's mean log-probability per token."
    )
    return_sentences: bool = Field(
        False, description="Also answer each text's sentences: each with its source as the "
        "model read it (for a pair through a pivot, in the pivot language), its translation, "
        "and its own alternatives and score when those are asked for; and the separators "
        "between them. Not with format html."
    )
    glossary_id: str | None = Field(
        None, description="Apply a stored glossary of the caller's (created through "
        "/v2/glossaries): each of its source terms found in the text (whole words, "
        "case-insensitive unless the term has inner capitals, longest first, not inside URLs "
        "or placeholders) comes out as its target term. Its pair must be the request's."
    )
    glossary: dict[str, str] | None = Field(
        None, description="Glossary entries given with the request, {source term: target "
        "term}, applied as glossary_id's are (at most MAX_GLOSSARY_ENTRIES)."
    )
    pivot: bool = Field(
        True, description="Translate a pair no bundle serves through English (X->en->Y) when "
        "bundles for both legs are loaded; false refuses such a pair (422)."
    )
    format: Literal["text", "html"] = Field(
        "text", description="html: translate the text of an HTML (or XML) fragment and keep its "
        "tags, attributes, entities and whitespace; code, pre, script, style and translate=no "
        "are left alone. No alternatives or scores for html (asking for them is a 422)."
    )


class Alternative(BaseModel):
    text: str
    score: float | None = None


class Sentence(BaseModel):
    source: str = Field(description="The sentence as the model read it.")
    text: str = Field(description="Its translation.")
    score: float | None = Field(None, description="Only with return_scores.")
    alternatives: list[Alternative] | None = Field(
        None, description="Its next-best translations (only with num_alternatives)."
    )


class TranslationResult(BaseModel):
    text: str = Field(description="The translation, with the input's whitespace and layout.")
    score: float | None = Field(
        None, description="Mean log-probability per token (only with return_scores)."
    )
    alternatives: list[Alternative] | None = Field(
        None, description="Next-best translations, best first (only with num_alternatives)."
    )
    sentences: list[Sentence] | None = Field(
        None, description="Only with return_sentences: text is separators[0] + "
        "sentences[0].text + separators[1] + ... + separators[-1]."
    )
    separators: list[str] | None = Field(
        None, description="Only with return_sentences: one more than sentences."
    )


class TranslateResponse(BaseModel):
    translations: list[TranslationResult] = Field(
        description="One result per input text, in order."
    )
    source_lang: str
    target_lang: str
    pivot_lang: str | None = Field(
        None, description="The language translated through, for a pair no bundle serves."
    )


class LanguagePair(BaseModel):
    source_lang: str
    target_lang: str
    model: str = Field(description="The bundle serving this pair; for a pivoted pair, the "
                       "two bundles joined by '+'.")
    pivot_lang: str | None = Field(
        None, description="The language translated through (X->en->Y), for a pair no bundle "
        "serves; absent for a bundle's own pair."
    )


class LanguagesResponse(BaseModel):
    pairs: list[LanguagePair]


class StatusResponse(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. queue_full.")
    message: str
    field: str | None = Field(None, description="The request field at fault, e.g. text[2].")


class ErrorResponse(BaseModel):
    error: ErrorDetail


# A body longer than this that carries an inline glossary is validated in parts
# (``translate_request``); a shorter one in one call of well under a millisecond.
_PARTED_CHARS = 65_536
# Characters of glossary entries validated per pydantic call: about half a millisecond each.
_PART_CHARS = 32_768
_GLOSSARY = re.compile(r'"glossary"\s*:\s*\{')
_CLOSED = re.compile(r"\s*\}")
# Up to 1,000 entries "source": "target" separated by commas, each string read to its
# closing quote (its escapes skipped over): a part's end where a guess at it failed
# (``_entries_at``).
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_ENTRY = rf"\s*{_STRING}\s*:\s*{_STRING}\s*"
_ENTRIES = re.compile(rf"{_ENTRY}(?:,{_ENTRY}){{0,999}}")
_GLOSSARY_PART: TypeAdapter[dict[str, str]] = TypeAdapter(dict[str, str])


def translate_request(text: str) -> TranslateRequest:
    """``TranslateRequest.model_validate_json(text)``: the same request, or the same errors.
    A large inline glossary is validated a part at a time, for one pydantic call holds the
    GIL throughout, and over a 100,000-entry glossary (3-4 MB) that is 60-150 ms in which
    the event loop, whose thread waits for the GIL, answers nothing, /health included."""
    if len(text) > _PARTED_CHARS:
        parted = _parted(text)
        if parted is not None:
            return parted
    return TranslateRequest.model_validate_json(text)


def _parted(text: str) -> TranslateRequest | None:
    """The request validated with ``{}`` in place of its glossary's entries, which are
    validated in parts; None, for the whole body to be validated in one call (and so answer
    its own errors), unless both are valid and the body names "glossary" once. Then the
    ``{}`` can only be the value of the request's top-level "glossary" (the one object a
    valid request holds), and the body is that request with those entries."""
    found = _GLOSSARY.search(text)
    if found is None:
        return None
    opened = found.end() - 1
    parsed = _entries_at(text, opened)
    if parsed is None:
        return None
    entries, closed = parsed
    rest = f"{text[:opened]}{{}}{text[closed:]}"
    if rest.count('"glossary"') != 1:
        return None  # a key given twice, or that may be: the one-call parse decides which
    try:
        request = TranslateRequest.model_validate_json(rest)
    except ValidationError:
        return None
    request.glossary = entries
    return request


def _entries_at(text: str, opened: int) -> tuple[dict[str, str], int] | None:
    """The entries of the JSON object that opens at ``opened``, and the index past its
    closing brace; None unless it is an object of strings. A part ends at a guess, the first
    '",' past ``_PART_CHARS``, tried as entries: a guess that falls inside a string (a term
    holding '",') leaves that string unterminated, and the object's end leaves trailing
    characters, so either fails, and the part is then found by ``_ENTRIES``."""
    entries: dict[str, str] = {}
    at = opened + 1
    if closed := _CLOSED.match(text, at):
        return entries, closed.end()
    while True:
        cut = text.find('",', at + _PART_CHARS, at + 2 * _PART_CHARS)
        part = None if cut == -1 else _part(text[at:cut + 1])
        end = cut + 1
        if part is None:
            matched = _ENTRIES.match(text, at)
            end = -1 if matched is None else matched.end()
            part = None if end in (-1, len(text)) else _part(text[at:end])
            if part is None or text[end] not in ",}":
                return None
        entries.update(part)  # a term given twice: its last target, at its first place
        if text[end] == "}":
            return entries, end + 1
        at = end + 1


def _part(members: str) -> dict[str, str] | None:
    try:
        return _GLOSSARY_PART.validate_json(f"{{{members}}}", strict=True)
    except ValidationError:
        return None
