"""Numbers written as words: the values from two to ninety-nine a text names ("twenty
minutes", "thirty-five", "zwanzig Minuten", "fünfunddreißig"), so that a translation can be
checked to keep them.

Why: a small model turns a number word into another one ("thirty" -> "dreiunddreißig"), and
nothing in the output shows it; the right one is often among its other hypotheses. The words
are num2words' for the language (about fifty languages; none for the others, which are then
not checked). One is left out: it is also an article or a pronoun ("one", "ein", "un"), and
so are words that are numbers only sometimes; a value names itself by its word alone, never
an ordinal ("second").
"""

from __future__ import annotations

import functools

import regex
from num2words import num2words

SMALLEST, LARGEST = 2, 99
# Written without spaces between words: a number word cannot be told from the word it is
# glued to ("三十分"), so these are not checked (num2words writes Japanese and Thai).
UNSPACED = frozenset({"ja", "zh", "th", "lo", "km", "my"})
_WORD = regex.compile(r"\p{L}+(?:-\p{L}+)*")
# Words a translation names a number with where the language says it so: "the two families"
# is "die beiden Familien" (of two known ones), which keeps the number as "zwei" does. Only
# read in translations: a source's "beide" is "both" as often as "the two".
_ALIASES = {"de": {word: 2 for word in ("beide", "beiden", "beider", "beidem", "beides")}}


@functools.lru_cache(maxsize=64)
def _words(lang: str) -> dict[str, int] | None:
    """Each number word of ``lang`` (case-folded) and its value; None for a language
    num2words does not write or one written without spaces."""
    if lang.split("-")[0].split("_")[0].lower() in UNSPACED:
        return None
    try:
        words = {num2words(n, lang=lang).casefold(): n for n in range(SMALLEST, LARGEST + 1)}
    except (NotImplementedError, KeyError, ValueError):
        return None
    for word, value in list(words.items()):  # "thirty-five" is also written "thirty five"
        if "-" in word:
            words.setdefault(word.replace("-", " "), value)
    return words


@functools.lru_cache(maxsize=64)
def _read_in_translation(lang: str) -> dict[str, int] | None:
    """``_words`` and the words a translation may name a number with instead (``_ALIASES``)."""
    words = _words(lang)
    aliases = _ALIASES.get(lang.split("-")[0].split("_")[0].lower(), {})
    return {**aliases, **words} if words else words


def number_values(text: str, lang: str, *, translation: bool = False) -> frozenset[int]:
    """The values from two to ninety-nine ``text`` writes as words in ``lang``; with
    ``translation``, also those it names the way a translation may ("die beiden": 2)."""
    words = _read_in_translation(lang) if translation else _words(lang)
    if not words:
        return frozenset()
    tokens = _WORD.findall(text.casefold())
    found, i = set(), 0
    while i < len(tokens):
        pair = f"{tokens[i]} {tokens[i + 1]}" if i + 1 < len(tokens) else ""
        if pair in words:
            found.add(words[pair])
            i += 2
            continue
        if tokens[i] in words:
            found.add(words[tokens[i]])
        i += 1
    return frozenset(found)


def number_terms(text: str, lang: str, target_lang: str) -> dict[str, str]:
    """Each number word of ``text`` (in ``lang``, as written there: "twenty", "Thirty-five",
    "forty two") and the same value written in ``target_lang`` ("zwanzig",
    "Fünfunddreißig"), capitalised where it starts the text; empty where either language is
    not written by num2words."""
    words = _words(lang)
    if not words or not _words(target_lang):
        return {}
    tokens = list(_WORD.finditer(text))
    found: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        span = None
        if i + 1 < len(tokens) and text[tokens[i].end():tokens[i + 1].start()] == " ":
            two = f"{tokens[i].group().casefold()} {tokens[i + 1].group().casefold()}"
            if two in words:
                span, value, i = (tokens[i].start(), tokens[i + 1].end()), words[two], i + 2
        if span is None and tokens[i].group().casefold() in words:
            span, value = tokens[i].span(), words[tokens[i].group().casefold()]
            i += 1
        elif span is None:
            i += 1
            continue
        surface = text[span[0]:span[1]]
        target = num2words(value, lang=target_lang)
        # Capitalised where it starts the sentence; a title's "Part Three" is "Teil drei".
        first = not text[:span[0]].strip()
        found[surface] = target[:1].upper() + target[1:] if first else target
    return found
