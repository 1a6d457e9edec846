"""Input normalisation shared by training and serving.

The vocabulary is trained without SentencePiece's own normalisation (it would turn "…" into
"..." and break exact detokenisation), so every sentence, in the corpus and in a request, goes
through ``clean_text`` before it is tokenised: training and serving must see the same text.
"""

from __future__ import annotations

import sys
import unicodedata
from functools import cache

# Zero-width (non-)joiners change rendering and meaning (Persian, Indic scripts, emoji
# sequences), unlike the other format characters (soft hyphens, BOMs, bidi marks, zero-width
# spaces), which are invisible noise that would only fragment the vocabulary.
_KEPT_FORMAT_CHARS = {"\u200c", "\u200d"}
# Controls that separate words become spaces so that "a\tb" does not turn into "ab" (U+0085 is
# NEL, a line break, although Windows-1252 would read that byte as an ellipsis).
_SPACING_CONTROLS = set("\t\n\v\f\r\x1c\x1d\x1e\x1f\x85")


def _cp1252_char(cp: int) -> str | None:
    # C1 controls (U+0080-U+009F) in real text are almost always Windows-1252 bytes decoded as
    # Latin-1 ("d\x92art" for "d’art", "Wiedemann\x96Franz"): restore the intended character
    # rather than gluing the words together.
    if 0x80 <= cp <= 0x9F:
        try:
            return bytes([cp]).decode("cp1252")
        except UnicodeDecodeError:  # the five bytes cp1252 leaves undefined
            return None
    return None


@cache
def _control_table() -> dict[int, str | None]:
    # Built lazily because scanning every code point costs a few hundred milliseconds, which
    # importers that never clean text (the service's health check, say) should not pay.
    table: dict[int, str | None] = {}
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        category = unicodedata.category(ch)
        if category == "Cc":
            table[cp] = " " if ch in _SPACING_CONTROLS else _cp1252_char(cp)
        elif category == "Cf" and ch not in _KEPT_FORMAT_CHARS:
            table[cp] = None
    return table


def build_tables() -> None:
    """Build the lookup table now; a server calls this at load time so that its first
    non-ASCII request does not pay for it."""
    _control_table()


def clean_text(text: str) -> str:
    """NFC, control and invisible format characters removed, whitespace folded and stripped.

    The vocabulary is trained without its own normalisation (see ``training.vocab``), so anything
    fed to the model at serving time must go through this same function.
    """
    # Almost every line is printable ASCII, which is already clean and NFC: skip the slow path.
    if not (text.isascii() and text.isprintable()):
        text = text.translate(_control_table())
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
    return " ".join(text.split())
