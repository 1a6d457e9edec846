"""The centre of the service: texts in, translations out, in one call (as CTranslate2's
``Translator.translate_batch``).

``Translator.translate(texts, pair, options)`` owns everything a request's text goes through
between an API shape and the scheduler: the decoding options (``resolve``: the request's, then
the settings', then the bundle's recommendation, then ``DecodeOptions``' defaults, checked
against the limits in one place), admission by a cheap estimate before any work, segmentation
into sentences (overlong ones into pieces the model can take, never cut), tokenisation, one
decoding of each repeated sentence, scheduling, and rejoining the translations in the original
layout with scores and alternatives. It reads as prepare (``service.pieces``) → decode (the
sentence cache, else the scheduler, which holds the request admitted until its last pass) →
second passes (``service.passes``) → assemble (``service.pieces``). Routes only map their
request shape onto this call and its results back; HTTP concerns (bodies, keys, rate limits,
disconnects, status codes) stay with them. ``Translator.load`` builds one from the settings
(the bundles, the scheduler); ``translate_batch`` is the same call for a program that has no
event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Collection, Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from service import markup
from service.bundle import Bundle
from service.engine import Engine
from service.glossary import Terms
from service.loading import EngineFactory, Pair, default_engine, pair_label, worker_count
from service.metrics import Metrics
from service.passes import Decode, SecondPasses
from service.pieces import assemble, prepare_texts
from service.request_types import (
    InvalidOption,
    SentenceResult,
    TextResult,
    TranslateOptions,
    fixed_options,
)
from service.residency import Residency
from service.scheduler import Admitted, DeadlineExceeded, QueueFull, Scheduler, ShuttingDown
from service.search import DecodeOptions, Translation
from service.sentence_cache import SentenceCache, SharedTier, model_fingerprint, sentence_key
from service.settings import Settings
from service.text import cut_at_sentences, estimate_sentences, split_sentences

# The request and result types are the Translator's vocabulary: its callers import them here.
__all__ = ["PIVOT", "InvalidOption", "Pair", "SentenceResult", "TextResult", "TranslateOptions",
           "Translator", "fixed_options", "pair_label"]

T = TypeVar("T")
_INLINE_CHARS = 2000  # below this, segmenting on the event loop beats a thread hop
WARMUP_SENTENCE = "Hello world."
PIVOT = "en"  # the language two bundles meet in, for a pair no bundle serves
# A document's sentences in flight: requests of this many, this many requests at once.
BACKGROUND_SENTENCES, BACKGROUND_REQUESTS = 32, 4
# The longest a request of ``translate_many`` waits before it asks a full queue again.
QUEUE_FULL_WAIT_S = 1.0


class Translator:
    """Texts in, translations out, over the loaded engines (one per pair) and the scheduler
    that batches every request's sentences together.

    The service builds one with ``load`` and awaits ``translate``; a program uses it as
    CTranslate2's ``Translator``::

        with Translator.open("models/en-de") as translator:
            results = translator.translate_batch(["Hello world."], beam_size=4)

    ``translate_batch`` runs the same ``translate`` on an event loop of its own.
    """

    def __init__(self, residency: Residency, scheduler: Scheduler, settings: Settings,
                 metrics: Metrics | None = None):
        self.residency = residency
        self.scheduler = scheduler
        self.settings = settings
        self.metrics = metrics
        # A sentence's translation does not depend on its batch (export checks it), so a
        # cached one is what decoding it again would give.
        self.cache = SentenceCache(settings.cache_mb * 2**20, metrics)
        self.shared_cache: SharedTier | None = None  # the replicas' tier, with STATE_URL
        self.models: dict[Pair, str] = {}  # each pair's fingerprint, once its model loaded
        self.pivots = pivots_of(self.pairs)
        # A bundle's place names, for the pair it was trained on (service.bundle).
        self.place_names = {
            pair: Terms(bundle.terms, names=True) for pair, bundle in self.pairs.items()
            if settings.place_names and bundle.terms
            and pair == (bundle.source_lang, bundle.target_lang)}
        self._loop: _LoopThread | None = None
        self._loop_lock = threading.Lock()
        self._closed = False
        self._requests: asyncio.Semaphore | None = None

    @property
    def engines(self) -> dict[Pair, Engine]:
        """The loaded engines by pair (``service.residency``)."""
        return self.residency.engines

    @property
    def pairs(self) -> dict[Pair, Bundle]:
        """Every pair a bundle serves, loaded or not, and its bundle."""
        return self.residency.bundles

    @classmethod
    def load(cls, settings: Settings, engine_factory: EngineFactory = default_engine,
             metrics: Metrics | None = None) -> Translator:
        """The bundles of ``settings.model_dir`` (those ``settings.models`` names) served,
        those ``settings.preload`` names loaded (every one without MODEL_MEMORY_MB), and the
        scheduler started; blocks while they load. The others load on their first request."""
        residency = Residency(settings, engine_factory, metrics)
        residency.open(settings.preload)
        engines = residency.engines
        scheduler = Scheduler(
            {pair_label(pair): engine for pair, engine in engines.items()},
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_rows=settings.max_batch_rows,
            max_queue=settings.max_queue,
            max_request_sentences=settings.max_request_sentences,
            batching=settings.batching,
            metrics=metrics,
            engine_failure_s=settings.engine_failure_s,
            workers=None if engines else worker_count(settings),
        )
        residency.attach(scheduler)
        scheduler.start()
        return cls(residency, scheduler, settings, metrics)

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

    def resolve(self, engine: Engine, options: TranslateOptions) -> DecodeOptions:
        """The decoding options of a request: its own, else the settings', else the bundle's
        recommendation (``engine``'s), else ``DecodeOptions``' defaults."""
        return engine.options(**fixed_options(options, self.settings))

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
        served = ", ".join(pair_label(p) for p in self.pairs)
        if pair is None:
            if len(self.pairs) != 1:
                raise ValueError(f"several pairs are served ({served}): name one")
            return next(iter(self.pairs))
        pair = (pair[0].lower(), pair[1].lower())
        if pair not in self.pairs and pair not in self.pivots:
            raise ValueError(f"no model for {pair_label(pair)} (served: {served})")
        return pair

    def _event_loop(self) -> _LoopThread:
        with self._loop_lock:
            if self._closed:
                raise ShuttingDown()
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    async def translate_many(self, texts: list[str], pair: Pair, options: TranslateOptions,
                             *, background: bool = False, deadline: float | None = None,
                             ) -> list[TextResult]:
        """``texts`` in requests the scheduler admits: consecutive texts estimated at up to
        MAX_REQUEST_SENTENCES each, at most as many at once as fill MAX_QUEUE, so that a
        caller of ``translate_batch`` is never refused for a full queue by its own texts.
        ``background`` work (a document) goes in requests of ``BACKGROUND_SENTENCES``,
        ``BACKGROUND_REQUESTS`` at a time, each queued behind the interactive requests in
        room of its own (the scheduler's background queue): enough to keep the batch full
        when nothing else waits, and never in an interactive request's way.

        This is work already accepted, so nothing about its size or the traffic beside it
        fails it: a plain text of more sentences than one request holds is cut between
        sentences into parts translated as texts of their own and joined back
        (``cut_at_sentences``), and a request that meets a full queue waits its turn
        (``QueueFull``'s Retry-After, at most ``QUEUE_FULL_WAIT_S``) instead of failing, until
        the ``deadline`` (the event loop's clock; None: none) of the request it serves."""
        limit = self.scheduler.max_request_sentences
        if background:
            limit = min(limit, BACKGROUND_SENTENCES)
        if self._requests is None:  # made on the loop that uses it
            self._requests = asyncio.Semaphore(max(1, self.settings.max_queue // limit))
        gate = asyncio.Semaphore(BACKGROUND_REQUESTS) if background else self._requests
        # Each text's parts (one, unless it is cut), with their sentence counts; in a thread
        # for a large input, where splitting takes seconds (a 700,000-character paragraph:
        # 3.7 s) that would otherwise be the event loop's.
        cut = await _off_loop(sum(map(len, texts)) > _INLINE_CHARS, lambda: [
            cut_at_sentences(text, limit)
            if (count := estimate_sentences(text)) > limit and options.format == "text"
            else [(text, count)] for text in texts])
        chunks: list[list[str]] = [[]]
        counted = 0
        for part, count in (part for parts in cut for part in parts):
            if chunks[-1] and counted + count > limit:
                chunks.append([])
                counted = 0
            chunks[-1].append(part)
            counted += count

        loop = asyncio.get_running_loop()

        async def translate(chunk: list[str]) -> list[TextResult]:
            async with gate:
                while True:
                    try:
                        return await self.translate(chunk, pair, options, deadline=deadline,
                                                    background=background)
                    except QueueFull as full:
                        wait = min(full.retry_after, QUEUE_FULL_WAIT_S)
                        if deadline is not None and loop.time() + wait >= deadline:
                            raise DeadlineExceeded() from None
                        await asyncio.sleep(wait)

        done = iter([result for results in await asyncio.gather(
            *(translate(chunk) for chunk in chunks if chunk)) for result in results])
        return [_joined([next(done) for _ in parts], [count for _, count in parts])
                for parts in cut]

    async def translate(self, texts: Sequence[str], pair: Pair, options: TranslateOptions,
                        *, deadline: float | None = None, request_id: str = "",
                        background: bool = False) -> list[TextResult]:
        """One result per text, in order. ``deadline`` is in the event loop's clock (None:
        none). Raises ``InvalidOption`` and the scheduler's ``SchedulerError``s (a refusal
        before any work is done, or a failure). HTML (``format="html"``) keeps its markup:
        its text segments are translated as texts and the document rebuilt around them
        (``service.markup``). A pair in ``pivots`` is translated in two legs, markup and
        untranslatables kept through both; its scores and alternatives are the second leg's,
        and each leg's sentences are cached under that leg's own pair. ``background`` work (a
        document's) waits behind interactive requests (``Scheduler.admitted``)."""
        via = self.pivots.get(pair)
        if via is not None:
            first = dataclasses.replace(options, num_alternatives=0, return_scores=False,
                                        return_sentences=False)
            middle = await self.translate(texts, (pair[0], via), first, deadline=deadline,
                                          request_id=request_id, background=background)
            return await self.translate([r.text for r in middle], (via, pair[1]), options,
                                        deadline=deadline, request_id=request_id,
                                        background=background)
        if options.format == "html":
            return await self._translate_html(texts, pair, options, deadline, request_id,
                                              background)
        # The model is loaded first if need be, and stays loaded until the last pass.
        async with self.residency.using(pair) as engine:
            return await self._translate_on(engine, texts, pair, options, deadline, request_id,
                                            background)

    async def _translate_on(self, engine: Engine, texts: Sequence[str], pair: Pair,
                            options: TranslateOptions, deadline: float | None, request_id: str,
                            background: bool = False) -> list[TextResult]:
        decoding = self.resolve(engine, options)
        if pair not in self.models:
            self.models[pair] = model_fingerprint(engine.bundle.manifest, engine.variant)
        # Admitted (or refused) by its estimated sentence count before any splitting or
        # tokenising: a refused request costs next to nothing. The estimate errs high, so one
        # over the limit is counted exactly before it is refused (MAX_REQUEST_CHARS bounds
        # that split's cost).
        sentences = sum(map(estimate_sentences, set(texts)))
        if sentences > self.scheduler.max_request_sentences:
            sentences = sum(len(split_sentences(text).pieces) for text in set(texts))
        # Held until the last pass: the glossary's and the number check's decodes belong to a
        # request already accepted, and are neither refused for a full queue nor cut by a drain.
        with self.scheduler.admitted(pair_label(pair), sentences, request_id,
                                     background) as admitted:
            protect_items = self.settings.protect_untranslatables
            prepared = await _off_loop(sum(map(len, texts)) > _INLINE_CHARS, lambda: prepare_texts(
                texts, engine, pair[1], protect_items))
            decode = self._decoder(pair, admitted, deadline)
            # Repeated sentences (boilerplate, list items) are decoded once, and sentences
            # translated before not again.
            unique: dict[tuple[int, ...], int] = {}
            for text in prepared:
                for ids in text.sources:
                    unique.setdefault(tuple(ids), len(unique))
            translations = await decode(list(unique), decoding)
            chosen = [[translations[unique[tuple(ids)]] for ids in text.sources]
                      for text in prepared]
            passes = SecondPasses(pair, decoding, decode, engine, protect_items)
            prepared, chosen = await passes.run(prepared, chosen, options.glossary,
                                                self.place_names.get(pair))
        return [
            assemble(text, pieces, options.num_alternatives, options.return_scores,
                     options.return_sentences)
            for text, pieces in zip(prepared, chosen, strict=True)
        ]

    async def _translate_html(self, texts: Sequence[str], pair: Pair, options: TranslateOptions,
                              deadline: float | None, request_id: str, background: bool = False,
                              ) -> list[TextResult]:
        # Parsing and rebuilding a large document takes the event loop for a second or more
        # (50,000 characters: 1.2 s), stalling every other request and the health probes.
        large = sum(map(len, texts)) > _INLINE_CHARS
        documents = await _off_loop(large, lambda: [
            markup.parse(text, ignore=options.ignore_tags) for text in texts])
        segments = markup.segments_of(documents)
        plain = dataclasses.replace(options, format="text", num_alternatives=0,
                                    return_scores=False, return_sentences=False)
        # A document's segments go in requests within the scheduler's limits, as
        # ``translate_many`` sends texts (an HTML file may hold thousands of sentences).
        if sum(map(estimate_sentences, segments)) > self.scheduler.max_request_sentences:
            done = await self.translate_many(segments, pair, plain, deadline=deadline,
                                             background=background)
        else:
            done = await self.translate(segments, pair, plain, deadline=deadline,
                                        request_id=request_id,
                                        background=background) if segments else []
        rendered = await _off_loop(large, lambda: markup.render_all(
            documents, [result.text for result in done]))
        return [TextResult(text) for text in rendered]

    def _decoder(self, pair: Pair, admitted: Admitted, deadline: float | None) -> Decode:
        """What decodes for one request: each source's translation from the sentence cache,
        or else from the scheduler as a pass of the ``admitted`` request."""

        async def decode(sources: Sequence[Sequence[int]], options: DecodeOptions,
                         ) -> list[Translation]:
            shared = self.shared_cache
            if not self.cache.enabled and shared is None:
                return await admitted.translate(sources, options, deadline)
            keys = [sentence_key(self.models[pair], pair, options, ids) for ids in sources]
            found = [self.cache.get(key) for key in keys]
            missing = [i for i, translation in enumerate(found) if translation is None]
            if missing and shared is not None:  # the replicas' tier, one round trip
                for i, translation in zip(missing, await shared.get_many(
                        [keys[i] for i in missing]), strict=True):
                    if translation is not None:
                        self.cache.put(keys[i], translation)
                        found[i] = translation
                missing = [i for i in missing if found[i] is None]
            # Called with none missing too: the request's first pass is over either way.
            decoded = await admitted.translate([sources[i] for i in missing], options, deadline)
            for i, translation in zip(missing, decoded, strict=True):
                self.cache.put(keys[i], translation)
                found[i] = translation
            if missing and shared is not None:
                shared.put_many([(keys[i], found[i]) for i in missing])
            return found  # type: ignore[return-value]  # every None was filled

        return decode


def _joined(parts: list[TextResult], sentences: list[int]) -> TextResult:
    """One text's result from the results of the parts it was cut into (``sentences`` in
    each): the texts, sentences and layout joined; the score, and each alternative's, the
    mean of the parts' weighted by their sentences; an alternative where every part has one."""
    if len(parts) == 1:
        return parts[0]

    def mean(scores: Sequence[float | None]) -> float | None:
        if any(score is None for score in scores):
            return None
        return sum(s * n for s, n in zip(scores, sentences, strict=True)) / sum(sentences)

    alternatives = None
    if all(part.alternatives is not None for part in parts):
        ranks = min(len(part.alternatives or ()) for part in parts)
        alternatives = [("".join((part.alternatives or [])[rank][0] for part in parts),
                         mean([(part.alternatives or [])[rank][1] for part in parts]))
                        for rank in range(ranks)]
    joined_sentences = separators = None
    if all(part.sentences is not None and part.separators for part in parts):
        joined_sentences = [sentence for part in parts for sentence in part.sentences or ()]
        separators = list(parts[0].separators or ())
        for part in parts[1:]:  # a part's leading layout follows the last one's trailing
            later = list(part.separators or ())
            separators[-1] += later[0]
            separators += later[1:]
    return TextResult("".join(part.text for part in parts), mean([p.score for p in parts]),
                      alternatives, joined_sentences, separators)


async def _off_loop(large: bool, work: Callable[[], T]) -> T:
    """``work()``, in a thread when its input is ``large``: below ``_INLINE_CHARS`` the thread
    hop costs more than the work, above it the work would hold up the event loop."""
    return await asyncio.to_thread(work) if large else work()


def pivots_of(pairs: Collection[Pair]) -> dict[Pair, str]:
    """The pairs no bundle serves that two bundles do through ``PIVOT``: X->Y as X->en then
    en->Y, as LibreTranslate serves them; the pivot language by pair."""
    sources = {source for source, target in pairs if target == PIVOT}
    targets = {target for source, target in pairs if source == PIVOT}
    return {(source, target): PIVOT for source in sources for target in targets
            if source != target and (source, target) not in pairs}


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
