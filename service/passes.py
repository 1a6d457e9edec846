"""The second passes: what a request's first translations are checked for, and decoded again
for, before they are assembled. Each pass is a policy over a decode function it is handed
(the sentence cache, then the request's admission in the scheduler), so that its decodes are
cached and belong to the request already admitted:

- the glossary (``hold_to``): a sentence lacking a target term is decoded again with the terms
  masked; a bundle's place names are terms that give way when the masks do worse (``_worse``);
- verbatim items (``keep_verbatim``): a sentence lacking a number its source writes in words,
  digits inside a word or an acronym (``_verbatim``, ``_missing``) is decoded again with a
  wider beam (``_wider``), and the hypothesis lacking the fewest is taken.
- numbers written as words (``spell_numbers``): a number word even the wider beam lost is
  masked and written the target language's way, over the glossary's and place names' masks.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from service.engine import Engine
from service.glossary import Terms, has_word
from service.loading import Pair
from service.number_words import number_terms, number_values
from service.pieces import Prepared
from service.placeholders import Restored, protect
from service.search import DecodeOptions, Hypothesis, Translation

# The beam a sentence whose number words came out as other numbers is decoded again with:
# beam 4's hypotheses held "dreißig" for "thirty" where beam 2's first named "dreiunddreißig"
# (docs/placeholders.md).
KEEP_NUMBERS_BEAM = 4
_DIGITS = re.compile(r"\d+")

# Token ids of sentences in, their translations out, in order.
Decode = Callable[[Sequence[Sequence[int]], DecodeOptions], Awaitable[list[Translation]]]


@dataclass(frozen=True)
class SecondPasses:
    """The second passes of one request: its pair, its decoding options and the function that
    decodes for it."""

    pair: Pair
    options: DecodeOptions
    decode: Decode
    engine: Engine  # tokenises a masked sentence
    protect_items: bool  # placeholders, URLs, numbers, ... masked too (service.placeholders)

    async def run(self, prepared: list[Prepared], chosen: list[list[Translation]],
                  glossary: Terms | None, place_names: Terms | None,
                  ) -> tuple[list[Prepared], list[list[Translation]]]:
        """Every pass in turn: the request's ``glossary`` over the bundle's ``place_names``
        (which give way where they do worse), then the verbatim items."""
        terms = glossary
        if place_names is not None:
            terms = place_names if terms is None else terms.over(place_names)
        if terms is not None:
            prepared, chosen = await self.hold_to(terms, prepared, chosen, required=glossary)
        chosen = await self.keep_verbatim(prepared, chosen)
        return await self.spell_numbers(prepared, chosen, terms, required=glossary)

    async def hold_to(self, glossary: Terms, prepared: list[Prepared],
                      chosen: list[list[Translation]], required: Terms | None = None,
                      ) -> tuple[list[Prepared], list[list[Translation]]]:
        """The glossary's terms, in every sentence that has one: a sentence whose own
        translation already holds each target term is kept as it is (most are: the model's
        sentence around the term is better than around a masked item); the others are
        translated again with the terms masked (``protect(terms=...)``), which puts each
        target term in whatever the model does. Where the model dropped a mask, which would
        go back by rule at the sentence's end, or lost a number its own translation kept
        ("zwanzig Minuten" as "vier Minuten"), the first hypothesis of a wider beam that did
        neither is taken; with none, terms not ``required`` (a bundle's place names) give
        way, and the sentence keeps its first translation."""
        again: dict[tuple[int, int], str] = {}
        first: dict[str, str] = {}  # each piece's own translation
        for t, (text, pieces) in enumerate(zip(prepared, chosen, strict=True)):
            for i, (piece, translation) in enumerate(zip(text.segmented.pieces, pieces,
                                                         strict=True)):
                targets = [target for *_, target in glossary.find(piece)]
                if not targets:
                    continue
                protected, best = text.protected[i], translation.hypotheses[0].text
                output = protected.restore(best).text if protected else best
                if not all(has_word(output, target) for target in targets):
                    again[t, i] = piece
                    first[piece] = output
        if not again:
            return prepared, chosen
        pair = self.pair
        masked = {piece: protect(piece, terms=glossary, untranslatables=self.protect_items)
                  for piece in set(again.values())}
        ids = {piece: self.engine.tokenize(p.text, pair[1]) for piece, p in masked.items()}
        order = list(masked)
        decoded = dict(zip(order, await self.decode(
            [tuple(ids[piece]) for piece in order], self.options), strict=True))
        # A masked translation that is worse gets a wider beam's hypotheses, and the first
        # that is not takes its place.
        optional = {piece for piece in order if required is None or not required.find(piece)}
        worse = {piece for piece in order
                 if _worse(masked[piece].restore(decoded[piece].text), piece, first[piece], pair)}
        if worse:
            listed = list(worse)
            for piece, translation in zip(listed, await self.decode(
                    [tuple(ids[piece]) for piece in listed], _wider(self.options)),
                    strict=True):
                good = next((h for h in translation.hypotheses if not _worse(
                    masked[piece].restore(h.text), piece, first[piece], pair)), None)
                if good is not None:
                    decoded[piece] = _first(good, translation)
                    worse.discard(piece)
        prepared = [dataclasses.replace(text, sources=list(text.sources),
                                        protected=list(text.protected)) for text in prepared]
        chosen = [list(pieces) for pieces in chosen]
        for (t, i), piece in again.items():
            if piece in optional and piece in worse:
                continue
            prepared[t].sources[i] = ids[piece]
            prepared[t].protected[i] = masked[piece]
            chosen[t][i] = decoded[piece]
        return prepared, chosen

    async def keep_verbatim(self, prepared: list[Prepared], chosen: list[list[Translation]],
                            ) -> list[list[Translation]]:
        """Numbers and acronyms kept: a sentence whose translation lacks a number its source
        names in words (two to ninety-nine, ``service.number_words``), digits inside a word,
        which no marker carries ("libwnck22", "IDNA2008"), or an upper-case word ("PID",
        "NETWORKDAYS"; ``_verbatim``) is decoded again with a beam of at least
        ``KEEP_NUMBERS_BEAM``, and the best hypothesis holding the most of them is taken
        ("thirty minutes": "dreißig", not the first hypothesis' "dreiunddreißig") when that
        is more than the translation held; else the translation stays as it was."""
        # (text, piece) -> what its source asks for, and how much of it the translation lacks
        again: dict[tuple[int, int], tuple[tuple[frozenset[int], Counter[str]], int]] = {}
        pair = self.pair
        for t, (text, pieces) in enumerate(zip(prepared, chosen, strict=True)):
            for i, (piece, translation) in enumerate(zip(text.segmented.pieces, pieces,
                                                         strict=True)):
                protected = text.protected[i]
                # Acronyms pass through only into the same script ("NASA" is "НАСА").
                source = protected.text if protected else piece
                wanted = (number_values(piece, pair[0]),
                          _verbatim(source, source=True, names=_latin(translation.text)
                                    and not _own_acronym(source, translation.text)))
                missing = _missing(translation.text, wanted, pair[1])
                if missing:
                    again[t, i] = wanted, missing
        if not again:
            return chosen
        order = list({tuple(prepared[t].sources[i]) for t, i in again})
        decoded = dict(zip(order, await self.decode(order, _wider(self.options)),
                           strict=True))
        chosen = [list(pieces) for pieces in chosen]
        for (t, i), (wanted, missing) in again.items():
            wider = decoded[tuple(prepared[t].sources[i])]
            lacking = [_missing(h.text, wanted, pair[1]) for h in wider.hypotheses]
            fewest = min(range(len(lacking)), key=lacking.__getitem__)  # the first of those
            if lacking[fewest] < missing:
                chosen[t][i] = _first(wider.hypotheses[fewest], wider)
        return chosen


    async def spell_numbers(self, prepared: list[Prepared], chosen: list[list[Translation]],
                            terms: Terms | None, required: Terms | None = None,
                            ) -> tuple[list[Prepared], list[list[Translation]]]:
        """Numbers written as words that even the wider beam lost ("twenty minutes" as "vier
        Minuten" in every hypothesis): those sentences are translated again with each number
        word masked and put back written the target language's way (``number_terms``:
        "zwanzig"), as a glossary's terms are (``hold_to``), over the request's ``terms`` (its
        glossary and the bundle's place names), so that names and numbers hold in one output.
        Where the masks do worse (a mask dropped), the sentence keeps its translation."""
        pair = self.pair
        numbers: dict[str, str] = {}
        texts: list[int] = []
        for t, (text, pieces) in enumerate(zip(prepared, chosen, strict=True)):
            lost = [number_terms(piece, pair[0], pair[1])
                    for piece, translation in zip(text.segmented.pieces, pieces, strict=True)
                    if number_values(piece, pair[0])
                    - number_values(translation.text, pair[1], translation=True)]
            for found in lost:
                numbers.update(found)
            if lost:
                texts.append(t)
        if not numbers:
            return prepared, chosen
        spelled = Terms(numbers) if terms is None else Terms(numbers).over(terms)
        again, held = await self.hold_to(spelled, [prepared[t] for t in texts],
                                         [chosen[t] for t in texts], required=required)
        prepared, chosen = list(prepared), list(chosen)
        for t, text, pieces in zip(texts, again, held, strict=True):
            prepared[t], chosen[t] = text, pieces
        return prepared, chosen


_MARKED = re.compile(r"\{\s*\d+\s*\}")  # an item's marker: its digits are not the text's


_INNER_CAPITAL = re.compile(r"[a-z][A-Z]")  # a product's name: "LibreOffice", "iPhone"


_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_WORD = re.compile(r"[^\W\d_]+")  # letters only: "IDNA2008" holds "IDNA"


def _latin(text: str) -> bool:
    """Whether most of ``text``'s letters are Latin ones."""
    letters = sum(map(len, _WORD.findall(text)))
    return 2 * len(_LATIN.findall(text)) >= letters


def _own_acronym(source: str, output: str) -> bool:
    """Whether ``output`` holds an upper-case word that is neither in ``source`` nor a mangled
    copy of one of its words ("NETWORKTAYS" of "NETWORKDAYS"): the model wrote the target
    language's own acronym ("OTAN" for "NATO", "SIDA" for "AIDS"), and is trusted with them."""
    words = set(_WORD.findall(source))
    return any(word not in words and not any(_alike(word, other) for other in words)
               for word in _WORD.findall(_MARKED.sub(" ", output))
               if len(word) >= 2 and word.isupper())


def _alike(copy: str, word: str) -> bool:
    """Whether ``copy`` is ``word`` cut ("ID" of "IDNA") or with a letter or two wrong."""
    return (copy.upper() in word.upper()
            or difflib.SequenceMatcher(None, copy.upper(), word.upper()).ratio() >= 0.75)


def _verbatim(text: str, source: bool = False, names: bool = True) -> Counter[str]:
    """The runs of digits and (with ``names``) the Latin upper-case words ("PID", "VBA",
    "NETWORKDAYS") of a model's input or output, its markers left out. In a source written
    mostly in capitals the words are shouted, and translated: only its digits count."""
    text = _MARKED.sub(" ", text)
    found = Counter(re.findall(r"\d+", text))
    if not names:
        return found
    words = _WORD.findall(text)
    capitals = [word for word in words if ((len(word) >= 2 and word.isupper())
                                           or _INNER_CAPITAL.search(word))
                and _latin(word)]
    if not source:  # an inflected acronym holds it: "des PCs", "APIs"
        capitals += [word[:-1] for word in words if word[-1] == "s" and len(word) >= 3
                     and word[:-1].isupper()]
    if not source or len(capitals) * 2 < len(words):
        found.update(capitals)
    return found


def _missing(output: str, wanted: tuple[frozenset[int], Counter[str]], lang: str) -> int:
    """How many of the number words and (as often) the runs of digits and upper-case words
    that ``wanted`` lists a model's ``output`` lacks."""
    words, verbatim = wanted
    return (len(words - number_values(output, lang, translation=True))
            + sum((verbatim - _verbatim(output)).values()))


def _wider(decode: DecodeOptions) -> DecodeOptions:
    """``decode`` with a beam of at least ``KEEP_NUMBERS_BEAM``, every hypothesis returned."""
    beam = max(KEEP_NUMBERS_BEAM, decode.beam_size)
    return dataclasses.replace(decode, beam_size=beam, num_hypotheses=beam)


def _first(hypothesis: Hypothesis, translation: Translation) -> Translation:
    """``translation`` with ``hypothesis`` (one of its own) first."""
    return Translation([hypothesis, *(h for h in translation.hypotheses if h is not hypothesis)])


def _worse(masked: Restored, source: str, first: str, pair: Pair) -> bool:
    """Whether a translation of ``source`` made with masks lost one (put back by rule),
    holds digits that ``source`` does not, or lost a number written as a word that ``first``,
    the translation without masks, kept."""
    kept = number_values(source, pair[0]) & number_values(first, pair[1], translation=True)
    return bool(masked.by_rule) or not set(_DIGITS.findall(masked.text)) <= set(
        _DIGITS.findall(source)) or not kept <= number_values(masked.text, pair[1],
                                                                 translation=True)
