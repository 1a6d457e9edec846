"""What a caller asks of a translation and what it gets back, whatever API it speaks: the
options (``TranslateOptions``, checked by ``fixed_options``) and the results (``TextResult``,
``SentenceResult``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from service.glossary import Terms
from service.settings import Settings

FORMATS = ("text", "html")


@dataclass(frozen=True)
class TranslateOptions:
    """What a caller may ask for, whatever API it speaks; None leaves it to the settings and
    the bundle (``Translator.resolve``)."""

    beam_size: int | None = None
    max_length: int | None = None
    no_repeat_ngram_size: int | None = None
    length_penalty: float | None = None  # beam score = log P / length ** this
    max_length_ratio: float | None = None  # at most this x source tokens + 10 generated
    num_alternatives: int = 0
    return_scores: bool = False
    format: str = "text"  # "text" | "html"
    return_sentences: bool = False  # each sentence with its source, as a reader aligns them
    ignore_tags: tuple[str, ...] = ()  # html: elements whose text is left as it is
    # A glossary's terms (service.glossary): each comes out as its target term.
    glossary: Terms | None = field(default=None, compare=False)


class InvalidOption(ValueError):
    """An option outside the service's limits; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SentenceResult:
    """One piece of a text (a sentence, or part of one too long for the model): the source as
    the model read it, its translation, and the next-best translations when asked for."""

    source: str
    text: str
    score: float | None = None
    alternatives: list[tuple[str, float | None]] | None = None


@dataclass(frozen=True)
class TextResult:
    """One text's translation; ``score`` is the mean log-probability per token (None unless
    asked for), ``alternatives`` the next-best texts with theirs (None unless asked for).
    With ``return_sentences``, ``text`` is ``separators[0] + sentences[0].text +
    separators[1] + ...``: what a reader needs to offer a sentence's alternatives."""

    text: str
    score: float | None = None
    alternatives: list[tuple[str, float | None]] | None = None
    sentences: list[SentenceResult] | None = None
    separators: list[str] | None = None


def fixed_options(options: TranslateOptions, settings: Settings) -> dict[str, Any]:
    """The decoding options a request and the settings fix, checked against the limits
    (``InvalidOption``); the bundle's recommendation fills in the rest (``Translator.resolve``).
    Cheap: routes call it first, to refuse a bad request before any other work."""
    if options.format not in FORMATS:
        raise InvalidOption("format", f"{options.format} format is not supported")
    wanted = options.num_alternatives + 1
    if options.beam_size is not None and options.beam_size > settings.max_beam:
        raise InvalidOption("beam_size", f"beam_size must be at most {settings.max_beam}.")
    # Alternatives need a wider beam than the default: the beam grows to fit them.
    beam = options.beam_size or max(settings.default_beam, min(wanted, settings.max_beam))
    if wanted > beam:
        raise InvalidOption(
            "num_alternatives",
            f"num_alternatives must be less than beam_size ({beam}); "
            f"at most {settings.max_beam - 1} with MAX_BEAM={settings.max_beam}.",
        )
    if options.max_length is not None and options.max_length > settings.max_length:
        raise InvalidOption("max_length", f"max_length must be at most {settings.max_length}.")
    fixed: dict[str, Any] = {"beam_size": beam, "num_hypotheses": wanted,
                             "max_length": options.max_length or settings.max_length}
    no_repeat = options.no_repeat_ngram_size
    if no_repeat is None:
        no_repeat = settings.no_repeat_ngram_size
    if no_repeat is not None:
        fixed["no_repeat_ngram_size"] = no_repeat
    # Neither changes what a sentence may cost: max_length caps its target either way.
    if options.length_penalty is not None:
        if not math.isfinite(options.length_penalty):
            raise InvalidOption("length_penalty", "length_penalty must be a finite number.")
        fixed["length_penalty"] = options.length_penalty
    if options.max_length_ratio is not None:
        if not 0 < options.max_length_ratio < math.inf:
            raise InvalidOption("max_length_ratio", "max_length_ratio must be above 0.")
        fixed["max_length_ratio"] = options.max_length_ratio
    return fixed
