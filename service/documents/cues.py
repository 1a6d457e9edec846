"""A subtitle's text as the Translator takes it: its markup (SubRip's ``<i>``, ``<font
face=...>`` and ``{\\an8}``, WebVTT's ``<v Speaker>``, ``<c.class>``, ``<ruby>``, karaoke
timestamps) and its line breaks become inline ``<c i="k">`` tags, so the words around them
are one sentence and every tag comes back exactly as written, attributes untranslated."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from lxml import etree

from service.documents.safexml import SAFE_XML

_MARKUP = re.compile(r"(<[^<>\n]*>|\{\\[^{}\n]*\}|\n)")


@dataclass
class Cue:
    fragment: str  # what the Translator gets
    tags: list[tuple[str, str]]  # each tag's opening (or only) text and its closing text


def encode(text: str, escaped: bool) -> Cue:
    """``text`` with its markup as ``<c i="k">`` tags; ``escaped``: its text holds character
    references (WebVTT's ``&amp;``), read as the characters they stand for."""
    pieces = _MARKUP.split(text)
    closing: dict[int, int] = {}  # an opening piece's index -> its closing piece's
    open_tags: list[int] = []
    for at, piece in enumerate(pieces):
        if at % 2 and piece.startswith("</"):
            if open_tags:
                closing[open_tags.pop()] = at
        elif at % 2 and piece.startswith("<") and not piece[1:2].isdigit():
            open_tags.append(at)
    tags: list[tuple[str, str]] = []
    parts: list[str] = []
    closes: dict[int, str] = {}
    for at, piece in enumerate(pieces):
        if at % 2 == 0:
            parts.append(html.escape(html.unescape(piece) if escaped else piece, quote=False))
        elif at in closes:
            parts.append(closes[at])
        elif at in closing:
            tags.append((piece, pieces[closing[at]]))
            parts.append(f'<c i="{len(tags) - 1}">')
            closes[closing[at]] = "</c>"
        else:  # a timestamp, a line break, a tag left open or closing nothing
            tags.append((piece, ""))
            parts.append(f'<c i="{len(tags) - 1}"/>')
    return Cue("".join(parts), tags)


def decode(translation: str, cue: Cue, escaped: bool) -> str:
    """The subtitle's text from its translation, each tag as the source wrote it."""
    built = etree.fromstring(f"<w>{translation}</w>", SAFE_XML)
    return _text(built, cue, escaped)


def _text(element: etree._Element, cue: Cue, escaped: bool) -> str:
    def text(value: str | None) -> str:
        return html.escape(value or "", quote=False) if escaped else value or ""

    parts = [text(element.text)]
    for child in element:
        opening, closing = cue.tags[int(child.get("i"))]
        parts += [opening, _text(child, cue, escaped), closing, text(child.tail)]
    return "".join(parts)
