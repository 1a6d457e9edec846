"""Plain text (its paragraphs, blank-line separated, translated with their layout kept) and
HTML (one text; ``service.markup`` keeps its markup)."""

from __future__ import annotations

import re

# Attributes a reader is shown or read out as text (an image's description, a tooltip, an
# empty field's hint, a screen reader's label): translated in a page or a book, where text
# left in the source language would be a gap. An HTML fragment sent to the text APIs keeps
# its attributes as written.
READER_ATTRIBUTES = ("alt", "title", "placeholder", "aria-label")
_BLANK_LINES = re.compile(r"(\n[ \t]*\n\s*)")


def paragraphs(text: str) -> tuple[list[str], list[str]]:
    """A plain text's paragraphs (split at blank lines) and the blank lines between them:
    ``paragraphs[0] + separators[0] + paragraphs[1] + ...``. A long document is so many
    texts of moderate size for the Translator, whose limits are per text."""
    parts = _BLANK_LINES.split(text)
    return parts[0::2], parts[1::2]



def read_text(text: str) -> tuple[list[str], list[str]]:
    """The paragraphs to translate, and the blank lines between them as the document."""
    pieces, separators = paragraphs(text)
    return separators, pieces


def write_text(separators: list[str], translations: list[str]) -> str:
    parts = [translations[0]]
    for separator, translation in zip(separators, translations[1:], strict=True):
        parts += [separator, translation]
    return "".join(parts)


def read_html(text: str) -> tuple[None, list[str]]:
    """A page is one text: the markup machinery splits it into sentences and keeps its tags."""
    return None, [text]


def write_html(_: None, translations: list[str]) -> str:
    return translations[0]
