"""Translate the text of an HTML or XML fragment and keep its markup.

``parse(fragment)`` cuts a fragment into the texts to translate (``Document.segments``) and
``Document.render(translations)`` puts the translations back; everything else comes out
byte for byte as it went in: tags with their attributes as written, entities, comments, the
doctype, whitespace, and the whole of ``<script>``, ``<style>``, ``<code>``, ``<pre>``,
``<textarea>`` (and ``kbd``, ``samp``, ``var``, ``svg``, ``math``, under any namespace prefix:
``<m:math>``) and of any element with ``translate="no"``, class ``notranslate``, class
``math`` (pandoc's TeX) or class ``literal`` (Docutils' inline code).

Segments. Each run of text between block boundaries (block elements' tags, ``<br>``,
comments, unknown elements, anything left alone) is one segment, without its leading and
trailing whitespace. Inline elements (``<b>``, ``<a href>``, ``<em>``, ``<span>``, ...) stay in
the segment as bare tags (``<a>``, ``</a>``, ``<img/>``): the model, trained on software
strings, carries such tags through with the words they wrap. An inline element left alone
(``<code>`` in a sentence) stays in as one ``<code/>``. So does an inline element whose text
is one untranslatable item (``service.placeholders``: a URL, ``@user@host``, ``#tag``,
``:emoji:``), a link whose text is part of its own address ("example.com"), and an element
marked as a handle (``HANDLE_CLASSES``): platforms cut such items with tags (Mastodon writes a
link as ``<span class="invisible">https://</span><span>example.com/x</span>`` and a hashtag as
``#<span>tag</span>``), and cut there neither the masking of items nor the model keeps them.
The model reads characters, not entities ("Fish & chips"); each comes back spelled as the
source spelled it (``_Spelling``).

Putting tags back (``render``). The tags in a translation are matched to the segment's own
in order (a longest common subsequence of their names and kinds), so every tag the model
kept in order returns, with its original attributes, where the model put it. A tag the model
dropped, moved out of order or mangled goes back by rule: an opening or closing tag at its
share of the text (as far into the translation as it was into the source), between the tags
placed before and after it and on the edge of a word (so "Hello <b>world</b>!" translated
"Hallo Welt!" gets "Hallo <b>Welt</b>!", and a pair dropped in one sentence of a paragraph
stays in about that sentence rather than spreading to its neighbours' tags), a single tag
that followed words right before the tag after it or else before the closing punctuation
(where ``service.placeholders`` puts an item back), another single tag right after the tag
before it, with the spaces it had; and a tag the model invented is removed. A tag the model broke
("https://span>" for "https://</span>", "</b") is first written whole again, so that no piece
of it is left to show as text. Hence the tags of the output are always exactly the input's,
in the same order, and the output is as well-formed as the input; when the model reorders
words, a pair wraps the words the model put inside it or, failing that, about as much of the
text as it wrapped in the source (possibly none: "<b></b>").
Whitespace inside a segment (line breaks in a paragraph's source) is the caller's to treat
as spaces when it cuts sentences.

Attribute values are kept as written, unless ``parse(..., attributes=("alt", "title"))``
asks for them: then each quoted, non-empty value of those attributes (outside what is left
alone) is a segment of its own, after the texts, and comes back escaped for its quotes.

Parser. Python's ``html.parser`` (the standard library's, maintained with CPython): it
reports where each event starts in the source, so a fragment can be cut into source slices
and every byte outside the translated text comes back unchanged; malformed markup (unclosed
tags, a stray ``<``, bad entities) is passed on as text or tags. Where CPython's parser
itself fails (an assertion on ``<![`` before 3.13), the fragment comes back untranslated.
lxml, html5lib and selectolax build a normalised tree (closing tags, quoting attributes,
re-encoding entities, moving elements), which changes what callers sent.
"""

from __future__ import annotations

import html
import itertools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser

from service.placeholders import is_untranslatable

INLINE = frozenset({
    "a", "abbr", "acronym", "b", "bdi", "bdo", "big", "cite", "data", "del", "dfn", "em",
    "font", "i", "img", "ins", "label", "mark", "q", "s", "small", "span", "strike", "strong",
    "sub", "sup", "time", "tt", "u", "wbr"
})
UNTRANSLATED = frozenset({
    "script", "style", "code", "pre", "textarea", "kbd", "samp", "var", "svg", "math"
})
VOID = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr"
})
# Classes that keep an element as written: the web's opt-out, pandoc's TeX math spans, and
# Docutils' inline literals (``<span class="docutils literal">``, code a reader types as is).
LEFT_ALONE_CLASSES = frozenset({"notranslate", "math", "literal"})
# Classes that mark an inline element as a handle, whatever its text: mentions and hashtags of
# Mastodon, Pleroma and Misskey, Discourse's "hashtag-cooked" (whose text is a bare "dev"),
# the microformat card around a mention.
HANDLE_CLASSES = frozenset({"mention", "hashtag", "hashtag-cooked", "mention-group", "h-card"})
# An element of more events than this (tags and texts) or more characters is never one
# untranslatable item (Mastodon's link is 10 events).
_ITEM_EVENTS = 32
_ITEM_CHARS = 500
# What a tag looks like in a translation: "<b>", "</ b>", "<img/>", '<a href="x">' (the model
# invents attributes), also in source text.
_TAG = re.compile(
    r"<[ \t\r\n]*(/?)[ \t\r\n]*([A-Za-z][\w:.-]*)(?:[ \t\r\n][^<>]*?)?[ \t\r\n]*(/?)[ \t\r\n]*>")
_ESCAPES = {"&": "&amp;", "<": "&lt;", '"': "&quot;", "'": "&#39;"}
# The attributes of a start tag, as html.parser reads them (its attrfind_tolerant).
_TAG_NAME = re.compile(r"<[a-zA-Z][^\t\n\r\f />\x00]*(?:\s|/(?!>))*")
_ATTRIBUTE = re.compile(
    r"((?<=['\"\s/])[^\s/>][^\s/=>]*)(\s*=+\s*('[^']*'|\"[^\"]*\"|(?!['\"])[^>\s]*))?(?:\s|/(?!>))*")
# Where an attribute value to translate goes (the fragment holds no NUL, else none is taken).
_VALUE_MARK = "\x00%d\x00"
_VALUE = re.compile("\x00([0-9]+)\x00")
# Where a translation's closing punctuation starts: a single tag dropped after words goes
# back before it, as ``service.placeholders`` puts an item back.
_CLOSING = re.compile(r"[\s.!?\u2026:;\u3002\uff01\uff1f\"'\u201d\u2019\u00bb)\]]*$")
_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);?")


@dataclass(frozen=True)
class _Tag:
    """An inline tag of a segment: ``key`` is what it is matched by, ``raw`` its source."""

    key: tuple[str, str]  # ("open" | "close" | "void", lower-case name)
    raw: str
    in_text: bool = False  # tag-like text of the source ("a <b> c" with a lone "<")

    @property
    def bare(self) -> str:
        kind, name = self.key
        return {"open": f"<{name}>", "close": f"</{name}>", "void": f"<{name}/>"}[kind]


def _key(found: re.Match) -> tuple[str, str]:
    kind = "close" if found.group(1) else "void" if found.group(3) else "open"
    return kind, found.group(2).lower()


class _Spelling:
    """How the source wrote the characters that entities stand for.

    The model reads "Fish & chips", not "Fish &amp; chips"; on the way back the n-th "&" (or
    "—", "\xa0", ...) of the translation is written as the n-th one of the source was
    ("&amp;", "&mdash;", "&nbsp;" or the bare character), and any further "&" or "<" as
    "&amp;" or "&lt;" (so that no tag the model half wrote, '<a href="x', opens).
    ``&gt;`` stays an entity in the text the model reads, so that no tag appears that the
    source did not have ("&lt;b&gt;"), as does an entity that text right after it would
    change ("&amp;lt;")."""

    def __init__(self, texts: Sequence[str], quote: str = ""):
        # Characters some entity here stands for, and "&" and "<" always (a bare one must come
        # back as it was, and a new one escaped), and an attribute value's quote.
        self.chars = {"&", "<", *quote} | {c for text in texts for m in _ENTITY.finditer(text)
                              if len(c := html.unescape(m.group())) == 1 and c not in "<>"}
        self.written: dict[str, list[str]] = {c: [] for c in self.chars}
        self._either = re.compile(
            f"{_ENTITY.pattern}|[{''.join(re.escape(c) for c in sorted(self.chars))}]")

    def decode(self, text: str) -> str:
        def one(m: re.Match) -> str:
            seen = m.group()
            if seen in self.chars:
                self.written[seen].append(seen)
                return seen
            char = html.unescape(seen)
            if char in self.chars and not (
                    char == "&" and re.match(r"[#A-Za-z0-9]", text[m.end() : m.end() + 1])):
                self.written[char].append(seen)
                return char
            if char == seen:  # not an entity: its "&" is a bare one
                self.written["&"].append("&")
            return seen

        return self._either.sub(one, text)

    def encoder(self):
        used = dict.fromkeys(self.chars, 0)

        def one(m: re.Match) -> str:
            seen = m.group()
            if len(seen) > 1 and html.unescape(seen) != seen:
                return seen  # an entity the source kept, or the model wrote
            char, rest = seen[0], seen[1:]
            written = self.written[char]
            index, used[char] = used[char], used[char] + 1
            if index < len(written):
                return written[index] + rest
            return _ESCAPES.get(char, char) + rest

        return lambda text: self._either.sub(one, text)


@dataclass
class _Segment:
    pieces: list[str | _Tag] = field(default_factory=list)  # text (entities decoded) and tags
    spelling: _Spelling | None = None

    @classmethod
    def of(cls, pieces: list[str | _Tag], quote: str = "") -> _Segment:
        """A segment of source text pieces and inline tags (or an attribute's value)."""
        spelling = _Spelling([p for p in pieces if isinstance(p, str)], quote)
        decoded = [spelling.decode(p) if isinstance(p, str) else p for p in pieces]
        return cls(decoded, spelling)

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.bare for p in self.pieces)

    @property
    def tags(self) -> list[_Tag]:
        """Its tags, including tag-like text ("a <b> c" written in the source), in order."""
        tags: list[_Tag] = []
        for piece in self.pieces:
            if isinstance(piece, _Tag):
                tags.append(piece)
            else:
                tags.extend(_Tag(_key(m), m.group(), True) for m in _TAG.finditer(piece))
        return tags

    def render(self, translation: str) -> tuple[str, int, int]:
        """The translation with the source's tags; how many the model placed, how many
        went back by rule."""
        tags = self.tags
        source = "".join(p for p in self.pieces if isinstance(p, str))
        translation = _repaired(translation, {tag.key[1] for tag in tags}, source)
        found = list(_TAG.finditer(translation))
        kept = _common([_key(m) for m in found], [t.key for t in tags])  # tag -> found
        text, at = _untagged(translation, found, set(kept.values()))
        flat = self._flat()
        sides, shares = self._sides(flat), self._shares(flat)
        places = [0] * len(tags)
        for i, tag in enumerate(tags):
            later = [at[kept[j]] for j in range(i + 1, len(tags)) if j in kept]
            low, high = (places[i - 1] if i else 0), (later[0] if later else len(text))
            if i in kept:
                places[i] = at[kept[i]]
            elif tag.key[0] == "void" and sides[i][0]:  # after words: as placeholders go back
                places[i] = later[0] if later else _CLOSING.search(text).start()
            elif tag.key[0] == "void":  # right after the tag before
                places[i] = low
            else:  # where its share of the source puts it, between its neighbours
                places[i] = _word_edge(text, round(shares[i] * len(text)), low, high,
                                       tag.key[0] == "open")
        text, places = _lone_marks_kept(text, list(itertools.accumulate(places, max)), tags,
                                        flat)
        encode = self.spelling.encoder()
        out, start = [], 0
        for i, (tag, place) in enumerate(zip(tags, places, strict=True)):
            place = max(place, start)
            raw = encode(tag.raw) if tag.in_text else tag.raw
            if i not in kept and tag.key[0] == "void":
                raw = _spaced(raw, text, place, *sides[i][1:])
            out += [encode(text[start:place]), raw]
            start = place
        out.append(encode(text[start:]))
        return "".join(out), len(kept), len(tags) - len(kept)

    def _flat(self) -> list[str | None]:
        """The source's characters, None for each tag (as ``tags`` lists them)."""
        flat: list[str | None] = []
        for piece in self.pieces:
            if isinstance(piece, _Tag):
                flat.append(None)
                continue
            last = 0
            for m in _TAG.finditer(piece):
                flat += [*piece[last : m.start()], None]
                last = m.end()
            flat += piece[last:]
        return flat

    def _shares(self, flat: list[str | None]) -> list[float]:
        """Per tag, the share of the segment's text that comes before it in the source."""
        before, counts = 0, []
        for char in flat:
            if char is None:
                counts.append(before)
            else:
                before += 1
        return [count / max(before, 1) for count in counts]

    def _sides(self, flat: list[str | None]) -> list[tuple[bool, bool, bool]]:
        """Per tag: whether words come before it in the source, and whether whitespace is
        right before it and right after it."""
        sides, words = [], False
        for k, char in enumerate(flat):
            if char is None:
                before, after = flat[k - 1] if k else None, flat[k + 1 : k + 2] or [None]
                sides.append((words, bool(before and before.isspace()),
                              bool(after[0] and after[0].isspace())))
            else:
                words = words or char.isalnum()
        return sides


def _lone_marks_kept(text: str, places: list[int], tags: list[_Tag],
                     flat: list[str | None]) -> tuple[str, list[int]]:
    """``text`` and the tags' places with each pair that wrapped only punctuation in the
    source (a Word run holding the sentence's period) given its marks back where the model
    left the pair empty and the words before it do not already end with them: the model
    drops a mark that stands alone between tags."""
    gaps = "".join("\0" if char is None else char for char in flat).split("\0")[1:]
    for i in range(len(tags) - 1):
        if tags[i].key[0] != "open" or tags[i + 1].key != ("close", tags[i].key[1]):
            continue
        mark = gaps[i].strip()
        if (not mark or not all(unicodedata.category(c).startswith("P") for c in mark)
                or text[places[i]:places[i + 1]].strip()
                or text[:places[i]].rstrip().endswith(mark)):
            continue
        text = text[:places[i]] + mark + text[places[i]:]
        places = places[:i + 1] + [place + len(mark) for place in places[i + 1:]]
    return text, places


def _word_edge(text: str, place: int, low: int, high: int, opening: bool) -> int:
    """``place`` within [low, high] moved to the nearest edge of a word: an opening tag to the
    start of the word it falls in (or the next), a closing tag to the end of the word before
    it, so that a tag put back by rule never cuts a word."""
    place = min(max(place, low), high)
    if not opening:
        place = _outside_item(text, place, low, high)
    if opening:
        while place > low and not text[place - 1].isspace():
            place -= 1
        while place < high and text[place].isspace():
            place += 1
    else:
        while place < high and not text[place - 1 : place].isspace() and place and (
                text[place].isalnum()):
            place += 1
        while place > low and text[place - 1].isspace():
            place -= 1
    return place


def _outside_item(text: str, place: int, low: int, high: int) -> int:
    """``place`` moved to the nearer edge of the URL, address or other untranslatable item
    it falls in (``service.placeholders``): a closing tag's share of the text can land on a
    dot inside "example.org/b", and a tag there breaks the address."""
    start = place
    while start > low and not text[start - 1].isspace():
        start -= 1
    end = place
    while end < high and not text[end].isspace():
        end += 1
    end = start + len(text[start:end].rstrip(".,;:!?)]\"'"))
    if start < place < end and is_untranslatable(text[start:end]):
        return start if place - start <= end - place else end
    return place


def _spaced(raw: str, text: str, place: int, space_before: bool, space_after: bool) -> str:
    """A tag put back by rule into ``text`` at ``place``, with the spaces it had in the source
    where the translation has none (a link put back after "Blog" must not read "Blog<a>")."""
    if space_before and place and not text[place - 1].isspace():
        raw = " " + raw
    if space_after and text[place : place + 1].isalnum():
        raw += " "
    return raw


def _untagged(translation: str, found: list[re.Match], matched: set[int],
              ) -> tuple[str, list[int]]:
    """The translation without its tags, and where each found tag sat in it. A tag of the
    model's own between two spaces goes with one of them."""
    pieces, at, removed, start = [], [], 0, 0
    for index, m in enumerate(found):
        end = m.end()
        if index not in matched and translation[m.start() - 1 : m.start()] == " " and (
                translation[end : end + 1] == " "):
            end += 1
        pieces.append(translation[start : m.start()])
        at.append(m.start() - removed)
        removed += end - m.start()
        start = end
    pieces.append(translation[start:])
    return "".join(pieces), at


def _repaired(translation: str, names: set[str], source: str) -> str:
    """The translation with each tag the model broke ("</span", "span>", "b/>"), named as one
    of the segment's tags, written whole again ("https://</span>" came back as
    "https://span>"): then it is matched as any tag is, or removed, and no piece of it is
    left to show as text. What the source's own text holds is left as it is."""
    if not names:
        return translation
    either = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    broken = re.compile(
        rf"<[ \t\r\n]*(?P<close>/?)[ \t\r\n]*(?P<name>{either})(?![\w:.])(?P<void>[ \t\r\n]*/)?"
        rf"|(?:(?<![/<])/|(?<!<))(?P<name2>{either})[ \t\r\n]*(?P<void2>/?)>", re.IGNORECASE)

    def mend(text: str) -> str:
        def whole(m: re.Match) -> str:
            if m.group() in source:
                return m.group()
            if m.group("name"):
                kind = "/" if m.group("close") else ""
                return f"<{kind}{m.group('name')}{'/' if m.group('void') else ''}>"
            return f"<{m.group('name2')}/>" if m.group("void2") else f"</{m.group('name2')}>"

        return broken.sub(whole, text)

    out, start = [], 0
    for m in _TAG.finditer(translation):  # whole tags stay as they are
        out += [mend(translation[start : m.start()]), m.group()]
        start = m.end()
    out.append(mend(translation[start:]))
    return "".join(out)


def _common(found: Sequence[tuple[str, str]], wanted: Sequence[tuple[str, str]]) -> dict[int, int]:
    """A longest common subsequence of ``found`` and ``wanted``: index in wanted -> in found."""
    n, m = len(found), len(wanted)
    length = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            length[i][j] = (length[i + 1][j + 1] + 1 if found[i] == wanted[j]
                            else max(length[i + 1][j], length[i][j + 1]))
    pairs, i, j = {}, 0, 0
    while i < n and j < m:
        if found[i] == wanted[j]:
            pairs[j] = i
            i, j = i + 1, j + 1
        elif length[i + 1][j] >= length[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


@dataclass
class Document:
    """A fragment as verbatim source slices and segments (``parts``); ``segments`` are the
    texts to translate, in document order, then the attribute values to translate (whose
    places the verbatim slices mark with ``_VALUE``)."""

    parts: list[str | _Segment]
    values: list[_Segment] = field(default_factory=list)

    @property
    def segments(self) -> list[str]:
        return [p.text for p in self.parts if isinstance(p, _Segment)] + [
            v.text for v in self.values]

    def render(self, translations: Sequence[str]) -> str:
        """The fragment with segment i replaced by ``translations[i]``."""
        return self.restore(translations).text

    def restore(self, translations: Sequence[str]) -> Rendered:
        """``render``, saying how many inline tags the model placed and how many went back
        by rule."""
        segments = [p for p in self.parts if isinstance(p, _Segment)]
        if len(translations) != len(segments) + len(self.values):
            raise ValueError(f"{len(segments) + len(self.values)} segments, "
                             f"{len(translations)} translations")
        given = iter(translations)
        out, by_model, by_rule = [], 0, 0
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                text, placed, put_back = part.render(next(given))
                out.append(text)
                by_model, by_rule = by_model + placed, by_rule + put_back
        values = [value.render(next(given))[0] for value in self.values]
        text = "".join(out)
        if values:
            text = _VALUE.sub(lambda m: values[int(m.group(1))], text)
        return Rendered(text, by_model, by_rule)


@dataclass(frozen=True)
class Rendered:
    text: str
    by_model: int  # inline tags the model placed in order
    by_rule: int  # inline tags put back by rule (dropped, moved out of order or mangled)


class _Events(HTMLParser):
    """The fragment's events as (kind, start offset, tag name, attributes)."""

    def __init__(self, source: str):
        super().__init__(convert_charrefs=True)
        self.events: list[tuple[str, int, str, dict[str, str | None]]] = []
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", source)]
        self.feed(source)
        self.close()

    def parse_html_declaration(self, i: int) -> int:
        position = self.getpos()
        try:
            return super().parse_html_declaration(i)
        except AssertionError:  # CPython before 3.13 asserts on "<![" without a name after it
            self.lineno, self.offset = position  # moved before it raised
            end = self.rawdata.find(">", i + 2)
            if end < 0:
                return -1  # more to come, or passed on as text at the end
            self.handle_comment(self.rawdata[i + 2 : end])
            return end + 1

    def _add(self, kind: str, name: str = "", attrs: list | None = None) -> None:
        line, column = self.getpos()
        self.events.append((kind, self._line_starts[line - 1] + column, name, dict(attrs or [])))

    def handle_starttag(self, tag, attrs):
        self._add("void" if tag in VOID else "open", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._add("void", tag, attrs)

    def handle_endtag(self, tag):
        self._add("close", tag)

    def handle_data(self, data):
        self._add("text")

    def handle_comment(self, data):
        self._add("other")

    handle_decl = handle_pi = unknown_decl = handle_comment

    def handle_entityref(self, name):  # only without convert_charrefs; kept for safety
        self._add("text")

    handle_charref = handle_entityref


def _left_alone(name: str, attrs: dict[str, str | None], ignore: frozenset[str]) -> bool:
    """Whether an element is kept as written: code, math (MathML under any namespace prefix,
    ``<m:math>``, and pandoc's TeX spans, class ``math``), what the caller names, what is
    marked not to be translated."""
    classes = (attrs.get("class") or "").split()
    return (name in UNTRANSLATED or name.rpartition(":")[2] in UNTRANSLATED or name in ignore
            or (attrs.get("translate") or "").lower() == "no"
            or not LEFT_ALONE_CLASSES.isdisjoint(classes))


def _kept_whole(events: list[tuple[str, int, str, dict[str, str | None]]], ends: list[int],
                fragment: str, inline: frozenset[str] = INLINE) -> set[int]:
    """The opening events of the inline elements that stay whole, as one tag in their
    sentence: those marked as handles (``HANDLE_CLASSES``) and those whose text is one
    untranslatable item (a URL, @user, #tag, :emoji:, a number) or, for a link, a piece of
    its own address ("example.com"). Mastodon writes a link as three spans around "https://",
    "example.com/x" and "" and a hashtag as "#<span>tag</span>": cut at its tags, such an
    item is neither recognised nor copied through by the model."""
    whole: set[int] = set()
    for opening, closing in _closings(events).items():
        _, _, name, attrs = events[opening]
        if name not in inline:
            continue
        if HANDLE_CLASSES & set((attrs.get("class") or "").split()):
            whole.add(opening)
        elif closing - opening <= _ITEM_EVENTS:
            texts = [html.unescape(fragment[start : ends[index]])
                     for index, (kind, start, _, _) in enumerate(events[opening:closing], opening)
                     if kind == "text"]
            if _is_item("".join(texts), name, attrs):
                whole.add(opening)
    return whole


def _closings(events: list[tuple[str, int, str, dict[str, str | None]]]) -> dict[int, int]:
    """Opening event -> the event that closes it, by name, as elements left alone are
    closed (an opening tag never closed has none)."""
    closings: dict[int, int] = {}
    open_by_name: dict[str, list[int]] = {}
    for index, (kind, _, name, _) in enumerate(events):
        if kind == "open":
            open_by_name.setdefault(name, []).append(index)
        elif kind == "close" and open_by_name.get(name):
            closings[open_by_name[name].pop()] = index
    return closings


def _is_item(text: str, name: str, attrs: dict[str, str | None]) -> bool:
    """Whether an element's ``text`` is one untranslatable item, or a link's text is part of
    its address (a URL shown without its scheme, a bare host)."""
    text = text.strip()
    if not text or len(text) > _ITEM_CHARS or any(c.isspace() for c in text):
        return False
    if is_untranslatable(text):
        return True
    address = (attrs.get("href") or "").lower()
    shown = text.lower().rstrip("\u2026.")  # shortened with an ellipsis
    return name == "a" and ("." in shown or "/" in shown) and shown in address


def parse(fragment: str, attributes: Sequence[str] = (), ignore: Sequence[str] = (),
          inline: Sequence[str] = ()) -> Document:
    """Cut ``fragment`` (HTML or XML) into verbatim parts and segments to translate; the
    quoted values of ``attributes`` (e.g. ``("alt", "title")``) of the tags not left alone
    are segments too, after the texts. Elements named in ``ignore`` (DeepL's ``ignore_tags``)
    are left alone as well, and stay in their sentence as one inline tag: callers name the
    tags that wrap placeholders, terms and code inside sentences. Elements named in
    ``inline`` are inline besides HTML's (XLIFF's inline codes)."""
    ignored = frozenset(name.lower() for name in ignore)
    inline_names = INLINE | frozenset(name.lower() for name in inline)
    try:
        events = _Events(fragment).events
    except AssertionError:  # a parser bug on some malformed input: translate nothing
        return Document([fragment] if fragment else [])
    if any(a[1] > b[1] for a, b in itertools.pairwise(events)):  # out of order: ditto
        return Document([fragment])
    ends = [start for _, start, _, _ in events[1:]] + [len(fragment)] * bool(events)
    kept = _kept_whole(events, ends, fragment, inline_names)
    # Whatever the parser passed over without an event ("</>" at the start) stays as it is.
    parts: list[str | _Segment] = [fragment[: events[0][1]] if events else fragment]
    run: list[str | _Tag] = []
    alone: tuple[str, int] | None = None  # the element left alone and its nesting depth
    alone_start, inline_alone = 0, False

    values: list[_Segment] = []
    wanted = {a.lower() for a in attributes} if "\x00" not in fragment else set()

    def flush() -> None:
        parts.extend(_split_run(run))
        run.clear()

    def mark_values(tag: str) -> str:
        """``tag`` with each wanted attribute value cut out into ``values``."""
        name = _TAG_NAME.match(tag)
        if not name:
            return tag
        out, done = [], 0
        for m in _ATTRIBUTE.finditer(tag, name.end()):
            value = m.group(3) or ""
            if (m.group(1).lower() in wanted and value[:1] in ("'", '"')
                    and value[1:-1].strip()):
                out += [tag[done : m.start(3) + 1], _VALUE_MARK % len(values)]
                values.append(_Segment.of([value[1:-1]], quote=value[0]))
                done = m.end(3) - 1
        return "".join(out) + tag[done:]

    for index, ((kind, start, name, attrs), end) in enumerate(zip(events, ends, strict=True)):
        raw = fragment[start:end]
        kept_whole = alone is None and index in kept
        if (wanted & attrs.keys() and alone is None and not kept_whole
                and not _left_alone(name, attrs, ignored)):
            raw = mark_values(raw)
        if alone is not None:  # inside an element left alone
            depth = alone[1] + (kind == "open" and name == alone[0]) - (
                kind == "close" and name == alone[0])
            alone = (alone[0], depth) if depth else None
            if alone is None:
                whole = fragment[alone_start:end]
                if inline_alone:
                    run.append(_Tag(("void", name), whole))
                else:
                    flush()
                    parts.append(whole)
            continue
        if kind == "open" and (kept_whole or _left_alone(name, attrs, ignored)):
            alone, alone_start = (name, 1), start
            # Code and math in a sentence stay in it, as one tag.
            inline_alone = (name in inline_names or name in ignored or name.rpartition(":")[2]
                            in {"code", "kbd", "samp", "var", "math"})
            continue
        if kind == "text" or (kind != "other" and (name in inline_names or name in ignored)):
            if kind == "text":
                if run and isinstance(run[-1], str):
                    run[-1] += raw
                else:
                    run.append(raw)
            else:
                run.append(_Tag((kind, name), raw))
            continue
        flush()
        parts.append(raw)
    if alone is not None:  # never closed: left alone to the end
        flush()
        parts.append(fragment[alone_start:])
    flush()
    return Document(_merge(parts), values)


def _split_run(run: list[str | _Tag]) -> list[str | _Segment]:
    """A run of text and inline tags as [verbatim head, segment, verbatim tail]: whitespace
    and the tags wrapping the whole run stay out of the segment."""
    pieces = list(run)
    if not any(isinstance(p, str) and p.strip() for p in pieces):
        return ["".join(p if isinstance(p, str) else p.raw for p in pieces)]
    head: list[str] = []
    tail: list[str] = []
    while True:
        first, last = pieces[0], pieces[-1]
        if isinstance(first, str) and (not first.strip() or first != first.lstrip()):
            stripped = first.lstrip()
            head.append(first[: len(first) - len(stripped)])
            pieces[0:1] = [stripped] if stripped else []
        elif isinstance(last, str) and (not last.strip() or last != last.rstrip()):
            stripped = last.rstrip()
            tail.insert(0, last[len(stripped):])
            pieces[-1:] = [stripped] if stripped else []
        elif isinstance(first, _Tag) and first.key[0] == "void":
            head.append(first.raw)
            del pieces[0]
        elif isinstance(last, _Tag) and last.key[0] == "void":
            tail.insert(0, last.raw)
            del pieces[-1]
        elif _wraps(pieces):
            head.append(pieces[0].raw)
            tail.insert(0, pieces[-1].raw)
            pieces = pieces[1:-1]
        else:
            break
    return ["".join(head), _Segment.of(pieces), "".join(tail)]


def _wraps(pieces: list[str | _Tag]) -> bool:
    """Whether the first piece opens the element the last one closes."""
    first, last = pieces[0], pieces[-1]
    if not (isinstance(first, _Tag) and isinstance(last, _Tag) and len(pieces) > 2
            and first.key == ("open", last.key[1]) and last.key[0] == "close"):
        return False
    depth = 0
    for piece in pieces[:-1]:
        if isinstance(piece, _Tag) and piece.key[1] == first.key[1]:
            depth += {"open": 1, "close": -1}.get(piece.key[0], 0)
            if depth == 0:
                return False  # closed before the end
    return depth == 1


def _merge(parts: list[str | _Segment]) -> list[str | _Segment]:
    merged: list[str | _Segment] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    return merged


_SPACE = re.compile(r"\s+")  # whitespace inside an element reads as one space


def segments_of(documents: Sequence[Document]) -> list[str]:
    """The segments of ``documents``, in order, as they go to the Translator: whitespace
    inside an element is one space in HTML, so neither a line break nor an indented line's
    tabs and spaces end a sentence or set off a column there."""
    return [_SPACE.sub(" ", segment) for document in documents
            for segment in document.segments]


def render_all(documents: Sequence[Document], translations: Sequence[str]) -> list[str]:
    """Each of ``documents`` rendered with its share of ``translations`` (``segments_of``'s
    order)."""
    given = iter(translations)
    rendered = [document.render([next(given) for _ in document.segments])
                for document in documents]
    if next(given, None) is not None:
        raise ValueError("more translations than segments")
    return rendered
