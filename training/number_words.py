"""Training pairs with a number spelled out: "in 20 minutes" / "in 20 Minuten" also as "in
twenty minutes" / "in zwanzig Minuten".

Why: the corpus writes most small numbers as digits, which the model learns to copy, and spells
few out, so a number written as words comes out as another number word ("twenty minutes" ->
"hundert Minuten", the model card's number probes). A pair qualifies when its source and its
target each hold one number, the same one, from 2 to 99, standing on its own (not a time, a
version, a decimal, an ordinal or part of a name such as "Windows 7"); both sides get it spelled
out by ``num2words`` in their language (``prepare`` adds ``data.spell_numbers`` such copies of
each: the first with its own number, the others with numbers drawn from the same range, so that
every number word is seen, not only the corpus's common ones). One is left out: its German and
French forms agree with the noun ("eine Minute"), which a word list cannot know.
"""

from __future__ import annotations

import re

from num2words import num2words

SMALLEST, LARGEST = 2, 99
# A number counting what follows it: at the start or after a space, and followed by a space
# and a word ("20 minutes", "45 Prozent"), so not "3.5", "10:30", "crypt(3)", "{2}" or "PGP
# 2.x"; on the source side that word must be lower case, which leaves out "Qt 5 Designer".
_NUMBER = re.compile(r"(?:^|(?<= ))(\d+) (?=\w)")
_DIGIT = re.compile(r"\d")
# Words after which a number is a name or a label, not a quantity ("chapter 5", "level 3").
_LABELS = re.compile(
    r"\b(?:version|v|chapter|page|level|room|line|step|no|nr|number|figure|table|section|verse|"
    r"part|episode|season|track|channel|windows|ubuntu|debian|python|gnome|kde|opengl|directx|"
    r"ps|xbox|kapitel|seite|stufe|zimmer|zeile|schritt|abbildung|tabelle|abschnitt|vers|teil|"
    r"folge|staffel|kanal)\.?\s*$",
    re.IGNORECASE,
)


def _lone_number(text: str) -> re.Match[str] | None:
    """The one number ``text`` holds, standing on its own, or None (none, several, or glued)."""
    if len(_DIGIT.findall(text)) > 2:  # more digits than one number of at most two
        return None
    matches = list(_NUMBER.finditer(text))
    if len(matches) != 1 or len(matches[0].group(1)) != len(_DIGIT.findall(text)):
        return None
    match = matches[0]
    if match.group(1).startswith("0") or _LABELS.search(text[: match.start()]):
        return None
    before = text[: match.start()].split()
    if before and before[-1][:1].isupper() and len(before) > 1:  # "Mission Control 5 is"
        return None
    return match


def _spelled(text: str, match: re.Match[str], number: int, lang: str) -> str:
    words = num2words(number, lang=lang)
    if not text[: match.start(1)].strip(" \"'„“‘"):  # the sentence begins with it
        words = words[0].upper() + words[1:]
    return text[: match.start(1)] + words + text[match.end(1):]


def spell_out(source: str, target: str, source_lang: str, target_lang: str,
              number: int | None = None) -> tuple[str, str] | None:
    """The pair with its number in words on both sides (``number`` in place of its own, when
    given), or None when it does not qualify."""
    src_match, tgt_match = _lone_number(source), _lone_number(target)
    if src_match is None or tgt_match is None or src_match.group(1) != tgt_match.group(1):
        return None
    if not source[src_match.end():][:1].islower():  # after the space
        return None
    if not SMALLEST <= int(src_match.group(1)) <= LARGEST:
        return None
    number = int(src_match.group(1)) if number is None else number
    try:
        return (_spelled(source, src_match, number, source_lang),
                _spelled(target, tgt_match, number, target_lang))
    except NotImplementedError:  # a language num2words does not speak
        return None
