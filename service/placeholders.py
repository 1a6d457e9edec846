"""Keep untranslatable items (placeholders, URLs, e-mail addresses, handles, numbers, emoji)
verbatim.

``protect(text)`` replaces each item by a numbered marker the model copies through, and
``Protected.restore(translation)`` puts every item back exactly as it was, each exactly once,
whatever the model did with the markers:

- a marker the model kept (anywhere, in any order) becomes its item: placed by the model;
- half a marker ("{0", "0}", "m0}") whose number no whole marker holds counts as that marker;
- a marker the model dropped or mangled beyond recognition is put back by rule: at the start
  of the translation when the item opened the source, at its very end when the item closed
  the source, otherwise at the end before the translation's closing punctuation;
- an item the model wrote out itself instead of its marker, or a second copy of the marker of
  an item that occurs twice ("%s and %s"), counts as placed by the model;
- a second copy of a marker or of an item, or a marker with a number that was never handed
  out, is removed (an extra "%s" would crash the caller's printf).

The marker's form is ``MARKER`` (``{0}``, ``{1}``, ...): the en-de model, trained on software
strings, copies brace placeholders through in place more often than the other forms measured
(docs/placeholders.md). Any text in the source that already looks like a marker is itself
masked as an item, so a marker in a translation always means an item of ours.

Handles of social platforms are items too: mentions (``@user``, ``@user@host``), Lemmy's
communities (``!name@host``), hashtags (``#tag``, with at least one letter) and custom emoji
shortcodes (``:blobcat:``, with the zero-width spaces Misskey writes around them): a name
is not a word to translate, and the model rewrites them ("#opensource" -> "#Quelloffen").

Names joined by underscores (``max_length``, ``BLD_SHIPYARD_BASE``) are items: identifiers
of code, games and files, which the model would split and rewrite.

Numbers are masked as digit runs that stand alone (``20``, ``1,000``, ``3.5``, ``12:30``, not
the ``3`` of ``MP3``): restoring them verbatim is always correct for the digits, and keeps the
model from rewriting them. Numbers written as words are the model's to translate.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    from service.glossary import Terms

# The marker of item N: change the form here (the recogniser follows it). "%d" stands for the
# number, "%%" for a percent sign.
MARKER = "{%d}"

_PRINTF = (
    r"%[A-Za-z_]\w{2,}%(?![%<>])"  # %name% (Windows, game engines)
    r"|%[<>]"  # GCC's quotes: %<%qs%>
    r"|%\([A-Za-z_]\w*\)[-+0#]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa%]"  # %(name)s
    r"|%(?:\d+\$)?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn%]"
    r"|%\d+%?"  # Qt's %1, Boost.Format's %1%
    r"|%[A-Za-z]"  # strftime's %H, %Y, ...; GNU's %m
)
_BRACE = (
    r"\{\{[^{}\n]*\}\}"  # {{ name }} (Jinja, Handlebars, Angular)
    r"|\$\{[^{}\s]+\}"  # ${name}
    # $1 (a regular expression's group, a shell's argument), $HOME, and an amount in dollars
    # ("$1,000"): the model drops a lone "$" ("Replace $1 with" -> "1 ... ersetzen")
    r"|(?<![\w$])\$(?:\d+(?:[.,:]\d+)*|[A-Za-z_]\w*)(?!\w)"
    r"|\{[\w.\[\]]*(?:![rsa])?(?::[^{}\s]*)?\}"  # {0}, {count}, {0:.2f}, {user.name}
)
# Trailing punctuation belongs to the sentence, not the URL; brackets only when the URL
# opened them ("/wiki/Pie_(dish)").
_URL = (
    r"(?:https?://|ftp://|www\.)(?:[^\s<>\"()\[\]]|\([^\s<>\"()]*\)|\[[^\s<>\"\[\]]*\])+?"
    r"(?=[.,;:!?'\")\]]*(?:\s|$|[<>\"]))"
)
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_EMOJI = (
    r"\p{Regional_Indicator}{2}"  # flags
    r"|[#*0-9]\uFE0F?\u20E3"  # keycaps
    r"|\p{Extended_Pictographic}[\uFE0F\p{Emoji_Modifier}]*"
    r"(?:\u200D\p{Extended_Pictographic}[\uFE0F\p{Emoji_Modifier}]*)*"
)
# Not inside a word, a URL or an address ("C#", "page#top", "a@b.org", "12:30:45").
_MENTION = r"(?<![\w@!/.])(?:[@!]\w+(?:[.-]\w+)*@[\w-]+(?:\.[\w-]+)+|@\w+(?:[.-]\w+)*)"
_HASHTAG = r"(?<![\w&#/])#\w*[^\W\d_]\w*"
_SHORTCODE = r"(?:\u200b|(?<![\w:])):[A-Za-z0-9_][A-Za-z0-9_+-]+:(?:\u200b|(?![\w:]))"
_NUMBER = r"(?<![\w.,])\d+(?:[.,:]\d+)*(?!\w)"
# A name joined by underscores (``max_length``, ``FU_TRANSPATIAL_DRIVE``, ``config_file.txt``):
# code's, a game's or a file's, never a word of the language; the model splits and
# "translates" its parts ("FUSPIAL_DRIVE"). A label's mnemonic ("C_urrent", "Sa_ve As": GTK's
# access key, one underscore in a capitalised word) is a word, and is translated.
_IDENTIFIER = (r"(?<![\w./\\-])(?![A-Z][a-z]*_[a-z]+(?![\w.]))"
               r"\w*[^\W_]_+[^\W_][\w.]*(?<!\.)(?![\w/\\-])")
# Between two items, only these: the two are one run, masked as one item. A
# model given many markers in a row drops and reorders some ("1, 2, ... 16" came back with
# 12 and 14 moved to the end; 3,633 URLs in a row lost 102); one marker for the run keeps
# every item, in its order, with the separators as sent.
_RUN_GAP = regex.compile(r"[^\S\n]*(?:[,;/|&+·•–—-][^\S\n]*)*")
_SURPLUS = "\x00"
_CLOSING = regex.compile(r"[\s.!?…:;。！？\"'”’»)\]]*$")
# A sentence's final marks (before its closing quotes and brackets). Two or more ("!!!",
# "?!", "...") are the writer's emphasis, which the model rewrites ("!!!!", "?", "…").
_FINAL_CLOSERS = "\"'“”‘’«»‹›)]"
_FINAL_MARKS = regex.compile(rf"[.!?…]+(?=[{regex.escape(_FINAL_CLOSERS)}]*\s*$)")


# Markdown's emphasis and strikethrough written in plain text ("**strong**", "*em*",
# "~~gone~~"): the en-de model deletes the word between asterisks ("Und das ist ******"), so
# each run of delimiters that opens or closes a word is an item, put back where the model puts
# its marker. A lone asterisk between spaces or digits ("2 * 3", "5*3") is none.
_DELIMITERS = regex.compile(r"\*{1,3}|~~")
_EMPHASIS = r"(?<![\w*~])(?:\*{1,3}|~~)(?=[^\s*~])|(?<=[^\s*~])(?:\*{1,3}|~~)(?![\w*~])"


@functools.lru_cache(maxsize=8)
def _patterns(marker: str) -> tuple[regex.Pattern, regex.Pattern, regex.Pattern | None]:
    """The items (with anything that looks like ``marker``) and the markers, spaces inside
    allowed ("{ 0 }"), and so are doubled delimiters ("{2}}", "{{0}"): a model that writes a
    stray brace beside a marker would otherwise leave it in the text once the item is back.
    Third, half markers: opened and never closed ("{0"), or closed only ("0}", "m0}", the
    opening delimiter turned into a letter); None for a marker without both delimiters."""
    parts = marker.replace("%%", "\0").split("%d")
    before, after = (regex.escape(part.replace("\0", "%")) for part in parts)
    # Digits glued to a whole marker ("{17}1") are debris of the model's, taken with it: the
    # source's own digits are all masked, so none stands against a marker there.
    found = regex.compile((r"\d*" if after else "") + rf"(?:{before})+\s*(\d+)"
                          + (rf"\s*(?:{after})+\d*" if after else r"(?!\d)"))
    # Markers before printf and brace forms, so that a doubled one is taken whole.
    kinds = (_URL, _EMAIL, _MENTION, _HASHTAG, _SHORTCODE, found.pattern, _PRINTF, _BRACE,
             _IDENTIFIER, _EMOJI, _NUMBER, _EMPHASIS)
    # A closing half may follow a word ("und17}": the model glued it on); a letter before
    # the digits stands for the opening delimiter only where it starts a word.
    half = regex.compile(rf"{before}\s*(\d+)(?!\d|\s*{after})"
                         rf"|(?:(?<!\w|{before}\s*)[^\W\d_])?(?<!\d|{before}\s*)(\d+)\s*"
                         rf"(?:{after})+"
                         ) if before and after else None
    return regex.compile("|".join(f"(?:{kind})" for kind in kinds)), found, half


# An item (or a run of items) that starts, or ends, with a URL, an address or a number.
_ADDRESS_FIRST = regex.compile(rf"(?:{_URL}|{_EMAIL}|{_NUMBER})(?=[\s,;/|&+·•–—-]|$)")
_ADDRESS_LAST = regex.compile(rf"(?:^|(?<=[\s,;/|&+·•–—-]))(?:{_URL}|{_EMAIL}|{_NUMBER})$")
_GLUED_BEFORE = regex.compile(r"[\w.,;:!?]")


def _apart(item: str, marker: regex.Match) -> str:
    """A URL, e-mail address or number put where the model wrote its marker, with a space
    between it and a word or punctuation the model glued to the marker ("{15};{16}"): glued,
    two addresses read as one, and a number runs into the one before ("3;5"). None of them
    stood glued in the source (a number inside a word is no item). Placeholders keep their
    place as written ("Datei{0}")."""
    # A run's first and last words only: searching all of a run of thousands of URLs for
    # its last address took 0.17 s.
    first = _ADDRESS_FIRST.match(item.split(None, 1)[0])
    last = _ADDRESS_LAST.search(item.rsplit(None, 1)[-1])
    if not (first or last):
        return item
    text, start, end = marker.string, marker.start(), marker.end()
    before = " " if first and start and _GLUED_BEFORE.match(text[start - 1]) else ""
    after = " " if last and end < len(text) and regex.match(r"\w", text[end]) else ""
    return f"{before}{item}{after}"


@dataclass(frozen=True)
class Restored:
    """A translation with every item back: ``by_model`` are the indices of the items whose
    marker the model placed, ``by_rule`` those put back by rule, ``removed`` the number of
    surplus markers (copies or unknown numbers) taken out."""

    text: str
    by_model: tuple[int, ...]
    by_rule: tuple[int, ...]
    removed: int


@dataclass(frozen=True)
class Protected:
    """``text`` with ``items[i]`` replaced by ``marker % i``; each comes back as
    ``outputs[i]``: the item itself, or a glossary term's target term."""

    text: str
    items: tuple[str, ...]
    marker: str
    # Per item: whether it opened the source, and whether it closed it.
    at_start: tuple[bool, ...]
    at_end: tuple[bool, ...]
    outputs: tuple[str, ...] = ()
    emphasis: str = ""  # the source's final marks when two or more, which come back as sent

    def output(self, index: int) -> str:
        return self.outputs[index] if self.outputs else self.items[index]

    def restore(self, translation: str) -> Restored:
        restored = self._restore_items(translation)
        if not self.emphasis:
            return restored
        return dataclasses.replace(restored, text=_with_final_marks(restored.text,
                                                                    self.emphasis))

    def _restore_items(self, translation: str) -> Restored:
        if not self.items:
            return Restored(translation, (), (), 0)
        every, found, half = _patterns(self.marker)
        marked = {int(m.group(1)) for m in found.finditer(translation)}
        removed = 0
        if half is not None:
            translation, removed = self._mend_halves(half, translation, marked)
        by_model: list[int] = []

        def place(match: regex.Match) -> str:
            nonlocal removed
            seen = match.group()
            # A marker inside another form ("${17}") is the model's debris around our marker.
            is_marker = found.fullmatch(seen) or (None if seen in self.items
                                                  else found.search(seen))
            if is_marker:
                index = int(is_marker.group(1))
                if index >= len(self.items):
                    removed += 1
                    return _SURPLUS
                if index not in by_model:
                    by_model.append(index)
                    return _apart(self.output(index), match)
                seen = self.items[index]  # a copy: fine if it stands for a twin item
            elif seen not in self.items:
                return seen  # the model's own number, URL, ...: not ours to judge
            # The model copied an item itself, or a twin's marker ("%s and %s" -> "{1} {1}").
            for index, item in enumerate(self.items):
                if item == seen and index not in marked and index not in by_model:
                    by_model.append(index)
                    return self.output(index)
            removed += 1
            return _SURPLUS

        text = every.sub(place, translation)
        if removed:  # take the surplus out with one of the spaces around it, and with the
            # comma before it when it closed the sentence ("spät, 0}." -> "spät.")
            text = regex.sub(rf"[,;:]\s*{_SURPLUS}(?=\s*(?:[.!?…]|$))|^{_SURPLUS} "
                             rf"| {_SURPLUS}(?=[ .,;:!?]|$)|{_SURPLUS}", "", text)
        missing = [i for i in range(len(self.items)) if i not in by_model]
        for index in missing:
            text = self._put_back(text, index)
        return Restored(text, tuple(by_model), tuple(missing), removed)

    def _mend_halves(self, half: regex.Pattern, translation: str, marked: set[int],
                     ) -> tuple[str, int]:
        """A marker the model wrote half of (``half``; "m0}" is how the en-de model wrote
        "{0}") becomes the whole marker, when no whole one holds that number, and its number
        joins ``marked``: the item then goes where the model put it. Any other half marker (a
        number already placed, or never handed out: "{1444444", which a model given hundreds
        of markers writes) is debris, taken out as surplus: digits beside a marker's
        delimiter never come from the source, whose digits and markers are all masked.
        Returns the text and the number taken out."""
        removed = 0

        def mend(match: regex.Match) -> str:
            nonlocal removed
            index = int(match.group(1) or match.group(2))
            if index >= len(self.items) or index in marked:
                removed += 1
                return _SURPLUS
            marked.add(index)
            return self.marker % index

        return half.sub(mend, translation), removed

    def _put_back(self, text: str, index: int) -> str:
        item = self.output(index)
        if self.at_start[index]:
            return f"{item} {text}" if text else item
        cut = len(text) if self.at_end[index] else _CLOSING.search(text).start()
        head, tail = text[:cut], text[cut:]
        return f"{head} {item}{tail}" if head else f"{item}{tail}"


def _with_final_marks(translation: str, marks: str) -> str:
    """``translation`` ending in ``marks`` in place of its own final marks, or added where
    they would stand when it has none."""
    own = _FINAL_MARKS.search(translation)
    if own is not None:
        return translation[:own.start()] + marks + translation[own.end():]
    body = translation.rstrip()
    closers = len(body) - len(body.rstrip(_FINAL_CLOSERS))
    cut = len(body) - closers
    return translation[:cut] + marks + translation[cut:]


def _emphasis(text: str) -> str:
    marks = _FINAL_MARKS.search(text)
    return marks.group() if marks is not None and len(marks.group()) > 1 else ""


def protect(text: str, marker: str = MARKER, terms: Terms | None = None,
            untranslatables: bool = True) -> Protected:
    """Mask every untranslatable item of ``text`` (see the module's docstring; not with
    ``untranslatables`` false) and every glossary term ``terms`` finds outside them, which
    comes back as its target term; ``marker`` holds "%d" once, where the item's number goes."""
    spans: list[tuple[int, int, str]] = []  # (start, end, what comes back)
    found = ([(m.start(), m.end(), m.group()) for m in _patterns(marker)[0].finditer(text)]
             if untranslatables or terms is not None else [])
    if untranslatables:
        spans = _runs(text, found)
    if terms is not None:  # never a term inside a URL, a placeholder or another item
        spans += [(start, end, target) for start, end, target in terms.find(text)
                  if not any(start < b and a < end for a, b, _ in found)]
        spans.sort()
    if not spans:
        return Protected(text, (), marker, (), (), emphasis=_emphasis(text))
    parts, items, outputs, at_start, at_end = [], [], [], [], []
    position = 0
    for index, (start, end, output) in enumerate(spans):
        parts += [text[position:start], marker % index]
        items.append(text[start:end])
        outputs.append(output)
        at_start.append(not text[:start].strip())
        at_end.append(not text[end:].strip())
        position = end
    parts.append(text[position:])
    return Protected("".join(parts), tuple(items), marker, tuple(at_start), tuple(at_end),
                     tuple(outputs) if outputs != items else (), _emphasis(text))


def _runs(text: str, found: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """``found`` with each run of items that only ``_RUN_GAP`` separates made one item."""
    runs: list[tuple[int, int, str]] = []
    for start, end, item in found:
        # Glued items ("%5.2f%%") stay apart: the model handles those as it always did. So
        # do emphasis delimiters, which wrap words rather than stand in a list of items.
        if (runs and start > runs[-1][1] and not _DELIMITERS.fullmatch(item)
                and not _DELIMITERS.fullmatch(runs[-1][2])
                and _RUN_GAP.fullmatch(text, runs[-1][1], start)):
            first = runs[-1][0]
            runs[-1] = (first, end, text[first:end])
        else:
            runs.append((start, end, item))
    return runs


def is_untranslatable(text: str) -> bool:
    """Whether ``text`` (surrounding whitespace aside) is one item ``protect`` would mask:
    ``service.markup`` keeps an element holding only such an item whole."""
    return _patterns(MARKER)[0].fullmatch(text.strip()) is not None
