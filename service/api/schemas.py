"""Request and response bodies.

Requests are strict (no "4" for 4, no true for 1) and closed (unknown fields are errors): a typo
such as ``beamsize`` must fail loudly rather than be ignored. Limits that depend on settings
(``MAX_BEAM``, ``MAX_CHARS``, ...) are checked in the route, where the settings are.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
