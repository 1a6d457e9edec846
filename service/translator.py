"""The centre of the service: texts in, translations out, in one call (as CTranslate2's
``Translator.translate_batch``).

``Translator.translate(texts, pair, options)`` owns everything a request's text goes through
between an API shape and the scheduler: the decoding options (``resolve``: the request's, then
the settings', then the bundle's recommendation, then ``DecodeOptions``' defaults, checked
against the limits in one place), admission by a cheap estimate before any work, segmentation
into sentences (overlong ones into pieces the model can take, never cut), tokenisation, one
decoding of each repeated sentence, scheduling, and rejoining the translations in the original
layout with scores and alternatives. Routes only map their request shape onto this call and
its results back; HTTP concerns (bodies, keys, rate limits, disconnects, status codes) stay
with them. ``Translator.load`` builds one from the settings (the bundles, the scheduler);
``translate_batch`` is the same call for a program that has no event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import difflib
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from service import markup
from service.engine import Engine
from service.glossary import Terms, has_word
from service.loading import EngineFactory, Pair, default_engine, load_engines, pair_label
from service.metrics import Metrics
from service.number_words import number_values
from service.placeholders import Protected, Restored, protect
from service.scheduler import Admission, Scheduler, ShuttingDown
from service.search import DecodeOptions, Hypothesis, Translation
from service.sentence_cache import SentenceCache, SharedTier, model_fingerprint, sentence_key
from service.settings import Settings
from service.text import Segmented, estimate_sentences, split_long, split_sentences

__all__ = ["PIVOT", "InvalidOption", "Pair", "SentenceResult", "TextResult", "TranslateOptions",
           "Translator", "fixed_options", "pair_label"]

T = TypeVar("T")
_INLINE_CHARS = 2000  # below this, segmenting on the event loop beats a thread hop
_DIGITS = re.compile(r"\d+")
_HTML_SPACE = re.compile(r"\s+")
# The beam a sentence whose number words came out as other numbers is decoded again with:
# beam 4's hypotheses held "dreißig" for "thirty" where beam 2's first named "dreiunddreißig"
# (docs/placeholders.md).
KEEP_NUMBERS_BEAM = 4
FORMATS = ("text", "html")
WARMUP_SENTENCE = "Hello world."
PIVOT = "en"  # the language two bundles meet in, for a pair no bundle serves
# A document's sentences in flight: requests of this many, this many requests at once.
BACKGROUND_SENTENCES, BACKGROUND_REQUESTS = 32, 4


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
    inline_tags: tuple[str, ...] = ()  # html: elements inline besides HTML's (XLIFF's codes)
    attributes: tuple[str, ...] = ()  # html: attributes whose values are text (a page's alt)
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


class Translator:
    """Texts in, translations out, over the loaded engines (one per pair) and the scheduler
    that batches every request's sentences together.

    The service builds one with ``load`` and awaits ``translate``; a program uses it as
    CTranslate2's ``Translator``::

        with Translator.open("models/en-de") as translator:
            results = translator.translate_batch(["Hello world."], beam_size=4)

    ``translate_batch`` runs the same ``translate`` on an event loop of its own.
    """

    def __init__(self, engines: dict[Pair, Engine], scheduler: Scheduler, settings: Settings,
                 metrics: Metrics | None = None):
        self.engines = engines
        self.scheduler = scheduler
        self.settings = settings
        self.metrics = metrics
        # A sentence's translation does not depend on its batch (export checks it), so a
        # cached one is what decoding it again would give.
        self.cache = SentenceCache(settings.cache_mb * 2**20, metrics)
        self.shared_cache: SharedTier | None = None  # the replicas' tier, with STATE_URL
        self.models = {pair: model_fingerprint(engine.bundle.manifest, engine.variant)
                       for pair, engine in engines.items()}
        self.pivots = pivots_of(engines)
        # A bundle's place names, for the pair it was trained on (service.bundle).
        self.place_names = {
            pair: Terms(engine.bundle.terms, names=True) for pair, engine in engines.items()
            if settings.place_names and engine.bundle.terms
            and pair == (engine.bundle.source_lang, engine.bundle.target_lang)}
        self._loop: _LoopThread | None = None
        self._loop_lock = threading.Lock()
        self._closed = False
        self._requests: asyncio.Semaphore | None = None

    @classmethod
    def load(cls, settings: Settings, engine_factory: EngineFactory = default_engine,
             metrics: Metrics | None = None) -> Translator:
        """The bundles of ``settings.model_dir`` (those ``settings.models`` names) loaded, and
        the scheduler over them started; blocks while the bundles load."""
        engines = load_engines(settings, engine_factory)
        scheduler = Scheduler(
            {pair_label(pair): engine for pair, engine in engines.items()},
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_rows=settings.max_batch_rows,
            max_queue=settings.max_queue,
            max_request_sentences=settings.max_request_sentences,
            batching=settings.batching,
            metrics=metrics,
        )
        scheduler.start()
        return cls(engines, scheduler, settings, metrics)

    @classmethod
    def open(cls, model_dir: str | Path, **settings: Any) -> Translator:
        """A bundle, or a directory of bundles, loaded with the service's settings: the
        environment's (``service.settings``), under ``settings`` given as keywords
        (``threads=2``, ``cache_mb=0``, ...). ``close`` it, or use it in a ``with`` block."""
        return cls.load(Settings(model_dir=Path(model_dir), **settings))

    async def warm_up(self) -> None:
        """One short sentence per pair through the scheduler, so that the first request does
        not pay for the sessions' first runs."""
        for pair, engine in self.engines.items():
            sources = [engine.tokenize(WARMUP_SENTENCE, pair[1])]
            await self.scheduler.translate(pair_label(pair), sources, DecodeOptions(max_length=16))

    def close(self) -> None:
        """Stop the scheduler's workers (what is still queued fails with ``ShuttingDown``) and
        the event loop of ``translate_batch``. The service drains instead
        (``Scheduler.drain``)."""
        self.scheduler.stop_accepting()
        self.scheduler.stop()
        with self._loop_lock:
            self._closed = True
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def resolve(self, pair: Pair, options: TranslateOptions) -> DecodeOptions:
        """The decoding options of a request: its own, else the settings', else the bundle's
        recommendation, else ``DecodeOptions``' defaults."""
        return self.engines[pair].options(**fixed_options(options, self.settings))

    def translate_batch(self, texts: Sequence[str], pair: Pair | None = None,
                        options: TranslateOptions | None = None, **option_fields: Any,
                        ) -> list[TextResult]:
        """``translate`` for a program: blocks until every text is translated, with no
        deadline. ``pair`` (source, target) may be left out when one pair is loaded; options
        come as ``options``, as keywords (``beam_size=4``), or both (the keywords win).
        Texts of any number are sent in requests within MAX_REQUEST_SENTENCES, as many at
        once as MAX_QUEUE holds. Raises ``InvalidOption`` for an option outside the limits,
        ``ValueError`` for a pair not loaded, and the scheduler's errors."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings; put a single text in a list")
        pair = self._pair(pair)
        options = dataclasses.replace(options or TranslateOptions(), **option_fields)
        return self._event_loop().run(self.translate_many(list(texts), pair, options))

    def _pair(self, pair: Pair | None) -> Pair:
        loaded = ", ".join(pair_label(p) for p in self.engines)
        if pair is None:
            if len(self.engines) != 1:
                raise ValueError(f"several pairs are loaded ({loaded}): name one")
            return next(iter(self.engines))
        pair = (pair[0].lower(), pair[1].lower())
        if pair not in self.engines and pair not in self.pivots:
            raise ValueError(f"no model for {pair_label(pair)} (loaded: {loaded})")
        return pair

    def _event_loop(self) -> _LoopThread:
        with self._loop_lock:
            if self._closed:
                raise ShuttingDown()
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    async def translate_many(self, texts: list[str], pair: Pair, options: TranslateOptions,
                             *, background: bool = False) -> list[TextResult]:
        """``texts`` in requests the scheduler admits: consecutive texts estimated at up to
        MAX_REQUEST_SENTENCES each (a longer text alone), at most as many at once as fill
        MAX_QUEUE, so that a caller of ``translate_batch`` is never refused for a full queue
        by its own texts. ``background`` work (a document) goes in requests of
        ``BACKGROUND_SENTENCES``, ``BACKGROUND_REQUESTS`` at a time: enough to keep the
        batch full, never a backlog that every other request would queue behind."""
        limit = (BACKGROUND_SENTENCES if background else
                 self.scheduler.max_request_sentences)
        if self._requests is None:  # made on the loop that uses it
            self._requests = asyncio.Semaphore(max(1, self.settings.max_queue // limit))
        gate = asyncio.Semaphore(BACKGROUND_REQUESTS) if background else self._requests
        chunks: list[list[str]] = [[]]
        counted = 0
        for text in texts:
            count = estimate_sentences(text)
            if chunks[-1] and counted + count > limit:
                chunks.append([])
                counted = 0
            chunks[-1].append(text)
            counted += count

        async def translate(chunk: list[str]) -> list[TextResult]:
            async with gate:
                return await self.translate(chunk, pair, options)

        done = await asyncio.gather(*(translate(chunk) for chunk in chunks if chunk))
        return [result for results in done for result in results]

    async def translate(self, texts: Sequence[str], pair: Pair, options: TranslateOptions,
                        *, deadline: float | None = None, request_id: str = "",
                        ) -> list[TextResult]:
        """One result per text, in order. ``deadline`` is in the event loop's clock (None:
        none). Raises ``InvalidOption`` and the scheduler's ``SchedulerError``s (a refusal
        before any work is done, or a failure). HTML (``format="html"``) keeps its markup:
        its text segments are translated as texts and the document rebuilt around them
        (``service.markup``). A pair in ``pivots`` is translated in two legs, markup and
        untranslatables kept through both; its scores and alternatives are the second leg's,
        and each leg's sentences are cached under that leg's own pair."""
        via = self.pivots.get(pair)
        if via is not None:
            first = dataclasses.replace(options, num_alternatives=0, return_scores=False,
                                        return_sentences=False)
            middle = await self.translate(texts, (pair[0], via), first, deadline=deadline,
                                          request_id=request_id)
            return await self.translate([r.text for r in middle], (via, pair[1]), options,
                                        deadline=deadline, request_id=request_id)
        if options.format == "html":
            return await self._translate_html(texts, pair, options, deadline, request_id)
        decode = self.resolve(pair, options)
        engine = self.engines[pair]
        label = pair_label(pair)
        # Admitted (or refused) by its estimated sentence count before any splitting or
        # tokenising: a refused request costs next to nothing. The estimate errs high, so one
        # over the limit is counted exactly before it is refused (MAX_REQUEST_CHARS bounds
        # that split's cost).
        sentences = sum(map(estimate_sentences, set(texts)))
        if sentences > self.scheduler.max_request_sentences:
            sentences = sum(len(split_sentences(text).pieces) for text in set(texts))
        admission = self.scheduler.admit(label, sentences)
        # Held until the last pass: the glossary's and the number check's decodes belong to a
        # request already accepted, and are neither refused for a full queue nor cut by a drain.
        try:
            protect_items = self.settings.protect_untranslatables
            prepared = await _off_loop(sum(map(len, texts)) > _INLINE_CHARS, lambda: prepare_texts(
                texts, engine, pair[1], protect_items))
            # Repeated sentences (boilerplate, list items) are decoded once, and sentences
            # translated before not again.
            unique: dict[tuple[int, ...], int] = {}
            for text in prepared:
                for ids in text.sources:
                    unique.setdefault(tuple(ids), len(unique))
            translations = await self._decode(list(unique), pair, decode, deadline, admission,
                                              request_id)
            self.scheduler.release_room(admission)  # what the sentences did not take
            chosen = [[translations[unique[tuple(ids)]] for ids in text.sources]
                      for text in prepared]
            glossary, names = options.glossary, self.place_names.get(pair)
            if names is not None:
                glossary = names if glossary is None else glossary.over(names)
            if glossary is not None:
                prepared, chosen = await self._hold_to(glossary, prepared, chosen, engine, pair,
                                                       decode, deadline, admission, request_id,
                                                       required=options.glossary)
            chosen = await self._keep_verbatim(prepared, chosen, pair, decode, deadline,
                                               admission, request_id)
        finally:
            self.scheduler.release(admission)
        return [
            assemble(text, pieces, options.num_alternatives, options.return_scores,
                     options.return_sentences)
            for text, pieces in zip(prepared, chosen, strict=True)
        ]

    async def _hold_to(self, glossary: Terms, prepared: list[Prepared],
                       chosen: list[list[Translation]], engine: Engine, pair: Pair,
                       decode: DecodeOptions, deadline: float | None,
                       admission: Admission, request_id: str, required: Terms | None = None,
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
        protect_items = self.settings.protect_untranslatables
        masked = {piece: protect(piece, terms=glossary, untranslatables=protect_items)
                  for piece in set(again.values())}
        ids = {piece: engine.tokenize(p.text, pair[1]) for piece, p in masked.items()}
        order = list(masked)
        decoded = dict(zip(order, await self._decode(
            [tuple(ids[piece]) for piece in order], pair, decode, deadline, admission,
            request_id),
            strict=True))
        # A masked translation that is worse gets a wider beam's hypotheses, and the first
        # that is not takes its place.
        optional = {piece for piece in order if required is None or not required.find(piece)}
        worse = {piece for piece in order
                 if _worse(masked[piece].restore(decoded[piece].text), piece, first[piece], pair)}
        if worse:
            listed = list(worse)
            for piece, translation in zip(listed, await self._decode(
                    [tuple(ids[piece]) for piece in listed], pair, _wider(decode), deadline,
                    admission, request_id), strict=True):
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

    async def _keep_verbatim(self, prepared: list[Prepared], chosen: list[list[Translation]],
                             pair: Pair, decode: DecodeOptions, deadline: float | None,
                             admission: Admission, request_id: str) -> list[list[Translation]]:
        """Numbers and acronyms kept: a sentence whose translation lacks a number its source
        names in words (two to ninety-nine, ``service.number_words``), digits inside a word,
        which no marker carries ("libwnck22", "IDNA2008"), or an upper-case word ("PID",
        "NETWORKDAYS"; ``_verbatim``) is decoded again with a beam of at least
        ``KEEP_NUMBERS_BEAM``, and the best hypothesis holding the most of them is taken
        ("thirty minutes": "dreißig", not the first hypothesis' "dreiunddreißig") when that
        is more than the translation held; else the translation stays as it was."""
        # (text, piece) -> what its source asks for, and how much of it the translation lacks
        again: dict[tuple[int, int], tuple[tuple[frozenset[int], Counter[str]], int]] = {}
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
        decoded = dict(zip(order, await self._decode(order, pair, _wider(decode), deadline,
                                                     admission, request_id), strict=True))
        chosen = [list(pieces) for pieces in chosen]
        for (t, i), (wanted, missing) in again.items():
            wider = decoded[tuple(prepared[t].sources[i])]
            lacking = [_missing(h.text, wanted, pair[1]) for h in wider.hypotheses]
            fewest = min(range(len(lacking)), key=lacking.__getitem__)  # the first of those
            if lacking[fewest] < missing:
                chosen[t][i] = _first(wider.hypotheses[fewest], wider)
        return chosen

    async def _translate_html(self, texts: Sequence[str], pair: Pair, options: TranslateOptions,
                              deadline: float | None, request_id: str) -> list[TextResult]:
        # Parsing and rebuilding a large document takes the event loop for a second or more
        # (50,000 characters: 1.2 s), stalling every other request and the health probes.
        large = sum(map(len, texts)) > _INLINE_CHARS
        documents = await _off_loop(large, lambda: [
            markup.parse(text, attributes=options.attributes, ignore=options.ignore_tags,
                         inline=options.inline_tags)
            for text in texts])
        # Whitespace inside an element is one space in HTML: neither a line break nor an
        # indented line's tabs and spaces end a sentence or set off a column there.
        segments = [_HTML_SPACE.sub(" ", segment) for document in documents
                    for segment in document.segments]
        plain = dataclasses.replace(options, format="text", num_alternatives=0,
                                    return_scores=False, return_sentences=False)
        # A document's segments go in requests within the scheduler's limits, as
        # ``translate_many`` sends texts (an HTML file may hold thousands of sentences).
        if sum(map(estimate_sentences, segments)) > self.scheduler.max_request_sentences:
            done = await self.translate_many(segments, pair, plain)
        else:
            done = await self.translate(segments, pair, plain, deadline=deadline,
                                        request_id=request_id) if segments else []
        translated = iter(done)
        chosen = [[next(translated).text for _ in document.segments] for document in documents]
        rendered = await _off_loop(large, lambda: [document.render(translations) for document,
                                                   translations in zip(documents, chosen,
                                                                       strict=True)])
        return [TextResult(text) for text in rendered]

    async def _decode(self, sources: list[tuple[int, ...]], pair: Pair, decode: DecodeOptions,
                      deadline: float | None, admission: Admission | None, request_id: str,
                      ) -> list[Translation]:
        """Each source's translation, from the sentence cache or else the scheduler."""
        shared = self.shared_cache
        if not self.cache.enabled and shared is None:
            return await self.scheduler.translate(pair_label(pair), sources, decode, deadline,
                                                  admission=admission, request_id=request_id)
        keys = [sentence_key(self.models[pair], pair, decode, ids) for ids in sources]
        found = [self.cache.get(key) for key in keys]
        missing = [i for i, translation in enumerate(found) if translation is None]
        if missing and shared is not None:  # the replicas' tier, one round trip
            for i, translation in zip(missing, await shared.get_many([keys[i] for i in missing]),
                                      strict=True):
                if translation is not None:
                    self.cache.put(keys[i], translation)
                    found[i] = translation
            missing = [i for i in missing if found[i] is None]
        if missing:
            decoded = await self.scheduler.translate(
                pair_label(pair), [sources[i] for i in missing], decode, deadline,
                admission=admission, request_id=request_id)
            for i, translation in zip(missing, decoded, strict=True):
                self.cache.put(keys[i], translation)
                found[i] = translation
            if shared is not None:
                shared.put_many([(keys[i], found[i]) for i in missing])
        return found  # type: ignore[return-value]  # every None was filled


async def _off_loop(large: bool, work: Callable[[], T]) -> T:
    """``work()``, in a thread when its input is ``large``: below ``_INLINE_CHARS`` the thread
    hop costs more than the work, above it the work would hold up the event loop."""
    return await asyncio.to_thread(work) if large else work()


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
    return (len(words - number_values(output, lang))
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
    kept = number_values(source, pair[0]) & number_values(first, pair[1])
    return bool(masked.by_rule) or not set(_DIGITS.findall(masked.text)) <= set(
        _DIGITS.findall(source)) or not kept <= number_values(masked.text, pair[1])


def pivots_of(engines: dict[Pair, Engine]) -> dict[Pair, str]:
    """The pairs no bundle serves that two loaded bundles do through ``PIVOT``: X->Y as
    X->en then en->Y, as LibreTranslate serves them; the pivot language by pair."""
    sources = {source for source, target in engines if target == PIVOT}
    targets = {target for source, target in engines if source == PIVOT}
    return {(source, target): PIVOT for source in sources for target in targets
            if source != target and (source, target) not in engines}


@dataclass(frozen=True)
class Prepared:
    """One text ready to decode: its segmentation, and for each piece its token ids with its
    untranslatables masked (``service.placeholders``) and what restores them."""

    segmented: Segmented
    sources: list[list[int]]
    protected: list[Protected | None]  # None: nothing masked


def prepare_texts(texts: Sequence[str], engine: Engine, target_lang: str | None = None,
                  protect_items: bool = True) -> list[Prepared]:
    """Each text's segmentation and the token ids of its pieces, every piece short enough for
    the model (sentences longer than its positions are split, never cut). With
    ``protect_items`` placeholders, URLs, e-mail addresses, numbers and emoji are masked, so
    that each comes back verbatim, as often as it went in."""
    cache: dict[str, tuple[Protected | None, list[int]]] = {}

    def prepare(piece: str) -> tuple[Protected | None, list[int]]:
        if piece not in cache:
            protected = protect(piece) if protect_items else None
            masked = protected.text if protected else piece
            cache[piece] = protected, engine.tokenize(masked, target_lang)
        return cache[piece]

    prepared = []
    for text in texts:
        segmented = split_sentences(text)
        segmented = split_long(segmented, engine.max_source_tokens,
                               lambda p: len(prepare(p)[1]))
        protected, sources = zip(*map(prepare, segmented.pieces), strict=True) if (
            segmented.pieces) else ((), ())
        prepared.append(Prepared(segmented, list(sources), list(protected)))
    return prepared


def assemble(prepared: Prepared, translations: Sequence[Translation], num_alternatives: int,
             return_scores: bool, return_sentences: bool = False) -> TextResult:
    """One text's result: pieces' translations (untranslatables restored) in the original
    layout, the token-weighted mean score, and the k-th alternative built from each piece's
    k-th hypothesis; with ``return_sentences`` each piece's own."""
    # restored[i][k]: piece i's k-th hypothesis with its untranslatables put back
    restored = [[protected.restore(h.text).text if protected else h.text
                 for h in t.hypotheses[:num_alternatives + 1]]
                for protected, t in zip(prepared.protected, translations, strict=True)]
    variants: list[tuple[str, float | None]] = []
    for rank in range(num_alternatives + 1):
        chosen = [t.hypotheses[min(rank, len(t.hypotheses) - 1)] for t in translations]
        text = prepared.segmented.join([texts[min(rank, len(texts) - 1)] for texts in restored])
        if rank and any(text == seen for seen, _ in variants):
            continue  # a piece ran out of hypotheses: this would repeat an earlier text
        variants.append((text, _mean_score(chosen) if return_scores else None))
    (text, score), alternatives = variants[0], variants[1:]
    if not return_sentences:
        return TextResult(text, score, alternatives if num_alternatives else None)
    sentences = [
        SentenceResult(
            source, texts[0], _mean_score(t.hypotheses[:1]) if return_scores else None,
            [(other, _mean_score([h]) if return_scores else None)
             for other, h in zip(texts[1:], t.hypotheses[1:], strict=False)]
            if num_alternatives else None)
        for source, texts, t in zip(prepared.segmented.pieces, restored, translations,
                                    strict=True)]
    return TextResult(text, score, alternatives if num_alternatives else None, sentences,
                      list(prepared.segmented.separators))


def _mean_score(hypotheses: Sequence[Hypothesis]) -> float | None:
    """Mean log-probability per token over a text's sentences. Not the search's own score,
    which divides by length ** length_penalty: a client's threshold on this one must not move
    when a bundle's recommended length penalty does."""
    if not hypotheses:
        return None
    total = sum(h.log_prob for h in hypotheses) / sum(h.length for h in hypotheses)
    return total if math.isfinite(total) else None  # -inf has no JSON spelling


class _LoopThread:
    """An event loop running in a daemon thread of its own, for ``translate_batch``: the
    scheduler answers on the loop that asked, and a program may have none (or one that
    must not block)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="translator-loop",
                                       daemon=True)
        self.thread.start()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """``work``'s result, waiting for it; interrupted (Ctrl+C), the work is cancelled,
        which frees its rows in the running batch."""
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
