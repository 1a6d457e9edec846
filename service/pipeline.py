"""The one path every API's request takes, whatever its shape.

An API module parses its request shape into a ``PipelineRequest`` and calls ``translate`` (or
``start_document`` for an upload), which decide through one checklist, once and in this
order: load shedding (``service.overload``), the key, the limits (a text's here, a
document's as it is read), the options, readiness and the language pair (detecting the source
when asked; resolved among the loaded models, hence after readiness), the glossary, the rate
and usage limits, admission, then the Translator (under the request's deadline, abandoned if
the client hangs up; a document's job started in the background), and only then is the usage
charged. Every refusal or failure is a ``PipelineError`` with a stable ``code``; each API
renders it through its own table of codes (status and wording in that API's error shape). So
the same situation gets the same decision in every API, and only the words differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from fastapi import Request

from service.documents import DocumentJob
from service.glossary import (
    GlossaryError,
    GlossaryStore,
    SharedGlossaryStore,
    check_entries,
    compiled,
    valid_id,
)
from service.ratelimit import OverCharLimit, RateLimited
from service.scheduler import (
    DeadlineExceeded,
    ModelLoadFailed,
    QueueFull,
    RequestTooLarge,
    SchedulerError,
    SchedulerFailed,
    ShuttingDown,
    TranslationFailed,
    WorkerRestarted,
)
from service.settings import Settings
from service.shared_state import digest
from service.state import ServiceState
from service.translator import (
    InvalidOption,
    Pair,
    SentenceResult,
    TextResult,
    TranslateOptions,
    fixed_options,
)

T = TypeVar("T")
DEFAULT_PAIR: Pair = ("en", "de")  # the tie-breaker when several loaded pairs would fit
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # a client's X-Request-ID we log as is
# Ids made here: the process and a count, unique across replicas of the service without the
# ~7 us of a uuid4.
_ID_PREFIX = f"{os.getpid():x}-{int(time.time()):x}-"
_request_ids = itertools.count(1)


class PipelineError(Exception):
    """A request answered without a translation. ``code`` is what the APIs' tables map to a
    status; ``field`` names the request field at fault in the service's own terms (``text``,
    ``text[3]``, ``target_lang``), ``value`` the value at fault where the API's wording
    quotes it, ``retry_after`` the seconds to wait when waiting helps."""

    def __init__(self, code: str, message: str, field: str | None = None, *,
                 value: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.value = value
        self.retry_after = retry_after
        self.request_id = ""


@dataclass(frozen=True)
class PipelineRequest:
    """A translation request in no API's shape. ``source`` None is inferred from the loaded
    pairs; ``detect`` detects it instead (among the languages translated into ``target``).
    ``key`` is the API key the client sent in the body, for APIs that carry it there."""

    texts: list[str]
    options: TranslateOptions
    source: str | None = None
    target: str | None = None
    detect: bool = False
    pivot: bool = True  # a pair no bundle serves may be translated through PIVOT
    key: str = ""
    single: bool = False  # one text sent as a string: its field is "text", not "text[0]"
    glossary_id: str | None = None  # a stored glossary (service.glossary) to apply
    glossary: dict[str, str] | None = None  # or entries given with the request
    # An uploaded document's (filename, media type, kind: service.documents.FORMATS)
    document: tuple[str, str, str] | None = None
    document_data: bytes | None = None  # the uploaded file (texts: its words)


# The request as an API's parse made it: a ``PipelineRequest``, or one that also carries what
# that API's answer echoes.
Parsed = TypeVar("Parsed", bound=PipelineRequest)


@dataclass(frozen=True)
class PipelineResult(Generic[Parsed]):
    request: Parsed
    results: list[TextResult]  # one per text, in order
    pair: Pair
    detected: tuple[str, float] | None  # (language, confidence 0-1) when the source was detected
    request_id: str
    via: str | None = None  # the pivot language, for a pair translated in two legs


def request_id_of(request: Request) -> str:
    """The client's X-Request-ID when it is a plain token, else a new one: the logs of a
    failure name it, and so does the error response."""
    given = request.headers.get("x-request-id")
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return f"{_ID_PREFIX}{next(_request_ids):x}"


def body_limit(settings: Settings) -> int:
    # The largest body a valid request can be: every char JSON-escaped at worst (12 bytes for
    # a surrogate pair), plus room for the other fields. Anything larger is refused unread.
    return settings.max_texts * (settings.max_chars * 12 + 8) + 4096


async def read_body(request: Request, settings: Settings) -> bytes:
    """The request's body, refused unread past ``body_limit``."""
    limit = body_limit(settings)
    too_large = PipelineError("body_too_large", f"Request body exceeds {limit} bytes.")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def shed_when_behind(state: ServiceState) -> None:
    """Refuse at once while the event loop lags past MAX_LOOP_LAG_S: a request read now would
    wait behind the backlog until its client gives up (``service.overload``)."""
    lag = state.loop_lag.seconds
    state.metrics.loop_lag.set(lag)
    if lag > state.settings.max_loop_lag_s:
        state.metrics.shed.inc()
        raise PipelineError("overloaded", f"The server is overloaded ({lag:.1f} s behind); "
                            "retry later.", retry_after=max(1, round(lag)))


# Bodies above this are parsed in a thread: a 50,000-character JSON body parses in a few ms,
# a thread hop costs ~0.1 ms; a 343,000-character DOCX takes 0.49 s to read (Intel Xeon).
LARGE_BODY = 100_000


def shed_when_full(state: ServiceState) -> None:
    """Refuse at once, before the body is read, while the queue has no room for one more
    sentence: past capacity most requests are refused, and a refusal that parses its body
    first spends the CPU the accepted ones need."""
    if state.scheduler is not None:
        try:
            state.scheduler.check_room()
        except QueueFull as exc:
            raise scheduler_error(exc) from None


def check_key(state: ServiceState, http: Request, key: str) -> None:
    """``key`` against the known keys (``service.keys``), when the service asks for keys. An
    address that sent FAILED_KEYS_PER_MINUTE wrong or missing keys is refused without its key
    being compared, until its allowance refills, unless the key was right from there
    (``service.ratelimit.FailedKeys``): a guesser learns nothing faster than that."""
    if not state.keys.required:
        return
    address = http.client.host if http.client else ""
    if wait := state.failed_keys.wait(address, key):
        raise PipelineError("too_many_failed_keys", "Too many requests with a wrong or missing "
                            "API key from this address; retry later.", retry_after=wait)
    if key and state.keys.find(key) is not None:
        state.failed_keys.succeeded(address, key)
        return
    state.failed_keys.failed(address)
    if not key:
        raise PipelineError("missing_key", "Missing API key.")
    raise PipelineError("invalid_key", "Invalid API key.")


async def keyed_body(state: ServiceState, http: Request, parse: Callable[[bytes], T],
                     key: str | None, key_in_body: Callable[[T], str],
                     off_loop: bool = False,
                     key_first: Callable[[bytes], str] | None = None,
                     turn: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None
                     = None) -> tuple[T, str]:
    """The body read and parsed, and the API key checked: before the body is read when the
    API carries the key in a header (``key``), else as ``key_in_body`` finds it in what
    ``parse`` made of the body. Returns what ``parse`` made and the key. A large body, or any
    when ``off_loop`` (an uploaded document, which unpacks to far more than it weighs), is
    parsed in a thread, so that the event loop keeps answering others meanwhile.
    ``key_first`` reads the key from the body before ``parse`` does its work (an upload's form
    field): a file is then never unpacked for a wrong key. ``turn`` is waited for before
    ``parse`` runs (an upload's: ``DocumentJobs.checking``)."""
    if key is not None:
        check_key(state, http, key)
    body = await read_body(http, state.settings)
    if key is None and key_first is not None:
        key = await asyncio.to_thread(key_first, body) if off_loop else key_first(body)
        check_key(state, http, key)
    if turn is not None:
        async with turn():
            parsed = await asyncio.to_thread(parse, body)
    elif off_loop or len(body) > LARGE_BODY:
        parsed = await asyncio.to_thread(parse, body)
    else:
        parsed = parse(body)
    if key is None:
        key = key_in_body(parsed)
        check_key(state, http, key)
    return parsed, key


def check_texts(texts: Sequence[str], single: bool, settings: Settings) -> None:
    if len(texts) > settings.max_texts:
        raise PipelineError(
            "too_many_texts",
            f"{len(texts)} texts; at most {settings.max_texts} per request (MAX_TEXTS).",
            "text",
        )
    for index, text in enumerate(texts):
        if len(text) > settings.max_chars:
            raise PipelineError(
                "text_too_long",
                f"{len(text)} characters; at most {settings.max_chars} per text (MAX_CHARS).",
                "text" if single else f"text[{index}]",
            )
    total = sum(map(len, texts))
    if total > settings.max_request_chars:
        raise PipelineError(
            "too_many_characters",
            f"{total} characters; at most {settings.max_request_chars} per request "
            "(MAX_REQUEST_CHARS). Send the texts in several requests.",
            "text",
        )


def check_options(options: TranslateOptions, settings: Settings) -> None:
    """The options within the limits, refused before any other work."""
    try:
        fixed_options(options, settings)
    except InvalidOption as exc:
        raise PipelineError("invalid_field", str(exc), exc.field) from None
    if options.format == "html" and (options.num_alternatives or options.return_scores
                                     or options.return_sentences):
        # A document's segments are translated apart: it has no one score or alternative.
        field = ("num_alternatives" if options.num_alternatives else
                 "return_scores" if options.return_scores else "return_sentences")
        raise PipelineError("invalid_field", f"{field} is not available with format html.",
                            field)


def require_ready(state: ServiceState) -> None:
    if state.phase == "ready" and state.scheduler is not None and state.scheduler.accepting:
        return
    if state.phase == "failed":
        raise PipelineError("load_failed", f"Loading the models failed: {state.error}")
    if state.phase == "loading":
        raise PipelineError("not_ready", "Models are still loading.", retry_after=5)
    if state.phase == "ready":  # yet the scheduler refuses: its thread died
        raise PipelineError("unavailable", "The translation worker failed; restart the service.",
                            retry_after=5)
    raise PipelineError("shutting_down", "The service is shutting down.", retry_after=5)


def _code(language: str | None) -> str | None:
    return language.strip().lower() or None if language is not None else None


# A text counts as written in the target language when the detector gives that language at
# least this probability and more than any source language; below it (a word that reads as
# either, such as "Hotel") it is translated.
SAME_LANGUAGE_CONFIDENCE = 0.5


async def untranslated(texts: Sequence[str], options: TranslateOptions) -> list[TextResult]:
    """Texts already in the target language, in a translation's shape: each as it is, its
    score 0 (certain), no alternatives, one sentence when sentences are asked for."""
    return [TextResult(
        text,
        score=0.0 if options.return_scores else None,
        alternatives=[] if options.num_alternatives else None,
        sentences=[SentenceResult(text, text)] if options.return_sentences else None,
        separators=["", ""] if options.return_sentences else None,
    ) for text in texts]


def resolve_pair(state: ServiceState, request: PipelineRequest,
                 ) -> tuple[Pair, tuple[str, float] | None]:
    """The pair a request means (a loaded one, else one two loaded bundles serve through
    English unless the request refuses pivoting), and the detected source with its confidence
    when it was detected. Omitted languages are inferred when only one pair fits, and default
    to en and de when several do. A text detected in the target language gets the pair
    (target, target): it is returned unchanged (``untranslated``)."""
    pivots = state.pivots if request.pivot else {}
    engines = [*state.pairs, *pivots]
    source, target = _code(request.source), _code(request.target)
    detect = request.detect or source == "auto"
    if source == "auto":
        source = None
    fits = [pair for pair in engines
            if (source is None or pair[0] == source) and (target is None or pair[1] == target)]
    detected = None
    sources = sorted({pair[0] for pair in fits})
    if detect and sources:
        # The target language is a candidate too: a text already in it comes back as it is
        # (DeepL's answer), not read as the loaded source language and mangled.
        asked = sources if target is None or target in sources else [*sources, target]
        ranked = state.detect_languages(request.texts, asked)
        if ranked and ranked[0][0] == target and ranked[0][1] >= SAME_LANGUAGE_CONFIDENCE:
            return (target, target), ranked[0]
        ranked = [answer for answer in ranked if answer[0] in sources]
        # Text with no letters: the first candidate with no confidence, as LibreTranslate does.
        detected = ranked[0] if ranked else (sources[0], 0.0)
        fits = [pair for pair in fits if pair[0] == detected[0]]
    if len(fits) > 1:
        wanted = (source or DEFAULT_PAIR[0], target or DEFAULT_PAIR[1])
        fits = [pair for pair in fits if pair == wanted] or fits
    if len(fits) > 1:  # a bundle of its own beats two legs
        fits = [pair for pair in fits if pair not in pivots] or fits
    if len(fits) == 1:
        return fits[0], detected
    loaded = ", ".join(f"{s}-{t}" + (f" (via {pivots[s, t]})" if (s, t) in pivots else "")
                       for s, t in sorted(engines)) or "none yet"
    if fits:
        raise PipelineError(
            "ambiguous_language_pair",
            f"Several loaded pairs fit; give source_lang and target_lang. Loaded: {loaded}.",
            "target_lang" if target is None else "source_lang",
        )
    known_source = source is None or any(pair[0] == source for pair in engines)
    known_target = target is None or any(pair[1] == target for pair in engines)
    field, value = ("source_lang", source) if not known_source else ("target_lang", target)
    if known_source and known_target:  # both served, not together
        value = f"{source}-{target}"
    raise PipelineError(
        "unsupported_language_pair",
        f"No model for {source or '*'} -> {target or '*'}. Loaded: {loaded}.",
        field, value=value or "",
    )


def client_of(state: ServiceState, request: Request, key: str) -> str:
    """Whom the rate limits and usage count: the API key (already checked; named by its
    digest, so no key is stored), else the client address."""
    if state.keys.required:
        return "key:" + digest(key)[:32]
    return "addr:" + (request.client.host if request.client else "")


async def take_rate(state: ServiceState, client: str, chars: int, key: str) -> None:
    """Count a request of ``chars`` characters against its client's limits (its key's own,
    when it has some), or refuse it."""
    settings = state.settings
    quota = settings.usage_limit_chars
    if quota and await state.usage.count(client) + chars > quota:
        raise PipelineError("quota_exceeded", f"Quota exceeded: at most {quota} characters "
                            "per key (USAGE_LIMIT_CHARS).")
    record = state.keys.find(key) if key and state.keys.required else None
    caps = record.caps(state.limiter.caps) if record is not None else state.limiter.caps
    try:
        await state.limiter.take(client, chars, caps)
    except OverCharLimit as exc:
        raise PipelineError(
            "over_rate_limit",
            f"{exc.chars} characters; at most {exc.limit} per minute (CHARS_PER_MINUTE).",
            "text",
        ) from None
    except RateLimited as exc:
        raise PipelineError(
            "rate_limited",
            f"Too many requests or characters; this client's {exc.limit} is exceeded.",
            retry_after=exc.retry_after,
        ) from None


@dataclass(frozen=True)
class Checked(Generic[Parsed]):
    """A request past every check before the Translator: its key, whom it is counted for, its
    pair (and the detected source) and its options with the glossary's terms."""

    request: Parsed
    key: str
    client: str
    pair: Pair
    detected: tuple[str, float] | None
    options: TranslateOptions

    @property
    def same_language(self) -> bool:
        """Already in the target language (``resolve_pair``): returned as it is, and no
        glossary applies."""
        return self.pair[0] == self.pair[1]


async def _checklist(state: ServiceState, http: Request, parse: Callable[[bytes], Parsed],
                     key: str | None, hand_over: Callable[[Checked[Parsed]], Awaitable[T]],
                     *, document: bool, key_first: Callable[[bytes], str] | None = None) -> T:
    """The module's checklist, for texts and documents alike; ``hand_over`` admits the checked
    request and hands it to the Translator, and what it returns is returned once the usage is
    charged, the one point where it is."""
    settings = state.settings
    shed_when_behind(state)
    if not document:
        # A document waits among the documents (MAX_DOCUMENTS), not in the scheduler's queue.
        shed_when_full(state)
    # An upload unpacks to far more than it weighs: parsed off the event loop.
    request, key = await keyed_body(state, http, parse, key, lambda parsed: parsed.key,
                                    off_loop=document, key_first=key_first,
                                    turn=state.documents.checking if document else None)
    if not document:  # a document's limits are checked as it is read (MAX_DOCUMENT_CHARS)
        check_texts(request.texts, request.single, settings)
    check_options(request.options, settings)
    require_ready(state)
    pair, detected = resolve_pair(state, request)
    options = (request.options if pair[0] == pair[1] else
               await with_glossary(state, request, pair, key))
    client = client_of(state, http, key)
    characters = sum(map(len, request.texts))
    await take_rate(state, client, characters, key)
    outcome = await hand_over(Checked(request, key, client, pair, detected, options))
    await state.usage.add(client, characters)
    return outcome


async def translate(state: ServiceState, http: Request, parse: Callable[[bytes], Parsed],
                    key: str | None = None) -> PipelineResult[Parsed]:
    """A request through every check, in the module's order, then translated. ``parse`` reads
    the API's request shape from the body; ``key`` is the API key when the API carries it in
    a header (checked before the body is read), None when it comes in the body."""
    request_id = request_id_of(http)
    deadline = asyncio.get_running_loop().time() + state.settings.request_timeout_s

    async def translated(checked: Checked[Parsed]) -> PipelineResult[Parsed]:
        translator = state.translator
        assert translator is not None  # ready implies a translator
        texts, pair, options = checked.request.texts, checked.pair, checked.options
        work = (untranslated(texts, options) if checked.same_language else
                translator.translate(texts, pair, options, deadline=deadline,
                                     request_id=request_id))
        try:
            results = await unless_disconnected(http, work)
        except SchedulerError as exc:
            raise scheduler_error(exc, request_id) from None
        return PipelineResult(checked.request, results, pair, checked.detected, request_id,
                              translator.pivots.get(pair))

    try:
        return await _checklist(state, http, parse, key, translated, document=False)
    except PipelineError as exc:
        exc.request_id = request_id  # the logs name it, and so does the answer
        raise


def glossary_store(state: ServiceState) -> GlossaryStore | SharedGlossaryStore:
    """The glossaries' store, or a 503 naming why it cannot be opened (an unwritable
    DATA_DIR, a file of another layout)."""
    try:
        return state.glossaries
    except (GlossaryError, OSError, sqlite3.Error) as exc:
        raise PipelineError("unavailable", f"Glossaries are unavailable: {exc}") from None


def owner_of(state: ServiceState, key: str) -> str:
    """Whose glossaries and documents a request sees: its key's when the service has keys,
    else everyone's (one owner, "")."""
    return key if state.keys.required else ""


async def with_glossary(state: ServiceState, request: PipelineRequest, pair: Pair, key: str,
                        ) -> TranslateOptions:
    """The request's options with its glossary's terms (``service.glossary``): the stored
    glossary it names, which must be its caller's and of its pair, or the entries it gives."""
    if request.glossary_id is None and request.glossary is None:
        return request.options
    field = "glossary_id" if request.glossary_id is not None else "glossary"
    if pair in state.pivots:
        raise PipelineError("invalid_field", f"A glossary cannot be applied to "
                            f"{pair[0]}->{pair[1]}, which is translated through "
                            f"{state.pivots[pair]}: no bundle serves the pair itself.", field)
    if request.glossary_id is not None:
        if not valid_id(request.glossary_id):
            raise PipelineError("invalid_field", "Invalid glossary_id.", field,
                                value=request.glossary_id)
        glossary = await glossary_store(state).get(request.glossary_id,
                                                   owner_of(state, key))
        if glossary is None:
            raise PipelineError("glossary_not_found", "Glossary not found.", field,
                                value=request.glossary_id)
        if pair not in glossary.dictionaries:
            pairs = ", ".join(f"{s}->{t}" for s, t in glossary.dictionaries)
            raise PipelineError("invalid_field", f"The glossary is for {pairs}, the request "
                                f"for {pair[0]}->{pair[1]}.", field)
        entries = glossary.dictionaries[pair]
    else:
        entries = request.glossary or {}
        limit = state.settings.max_glossary_entries
        if len(entries) > limit:
            raise PipelineError("too_many_glossary_entries", f"{len(entries)} glossary "
                                f"entries; at most {limit} (MAX_GLOSSARY_ENTRIES).", field)
        try:  # as a stored glossary's entries are checked; off the loop, as they may be many
            await asyncio.to_thread(check_entries, entries, limit)
        except GlossaryError as exc:
            raise PipelineError("invalid_field", f"Invalid glossary: {exc}", field) from None
    return dataclasses.replace(request.options, glossary=await compiled(
        entries, stored=request.glossary_id is not None))


async def start_document(state: ServiceState, http: Request,
                         parse: Callable[[bytes], PipelineRequest], key: str | None,
                         key_first: Callable[[bytes], str] | None = None,
                         linked: bool = False) -> DocumentJob:
    """A document upload through the checks a translation takes, in the module's order, then
    its translation started in the background (``service.documents``), the document its
    caller's (``owner_of``). ``parse`` reads the upload into a request of one text (the
    document's), and raises PipelineErrors for a bad file; its ``document`` names the file,
    its type and kind. ``linked``: downloadable by its URL alone (LibreTranslate's)."""

    async def started(checked: Checked[PipelineRequest]) -> DocumentJob:
        if state.documents.full():
            raise PipelineError("queue_full", f"{state.settings.max_documents} documents are "
                                "being translated or waiting for their download "
                                "(MAX_DOCUMENTS); retry later.", retry_after=10)
        translator = state.translator
        assert translator is not None  # ready implies a translator
        request, pair, options = checked.request, checked.pair, checked.options
        assert request.document is not None  # parse names the file
        filename, media_type, kind = request.document
        text = request.texts[0]
        data = request.document_data if request.document_data is not None else text
        budget = state.settings.document_memory_mb
        if len(data) > budget * 2**20:
            raise PipelineError("document_too_large", f"The file has {len(data)} bytes; the "
                                f"documents accepted may hold at most {budget} MiB "
                                "(DOCUMENT_MEMORY_MB).", "file")
        if not state.documents.room_for(len(data)):
            raise PipelineError("queue_full", f"The documents being translated or waiting "
                                f"for their download hold {budget} MiB or would with this "
                                "one (DOCUMENT_MEMORY_MB); retry later.", retry_after=10)
        return await state.documents.start(
            owner_of(state, checked.key), filename, kind, media_type, pair, data,
            None if checked.same_language else
            (lambda texts: translator.translate_many(texts, pair, options, background=True)),
            len(text), linked=linked)

    return await _checklist(state, http, parse, key, started, document=True,
                            key_first=key_first)


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, abandoning it if the client hangs up first: a client that gave up (and
    perhaps retries) must not keep its sentences in the batch until the deadline."""

    async def disconnected() -> None:
        # The body is read, so the next ASGI message can only be the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # frees the request's rows in the scheduler
    if task not in done:
        raise PipelineError("client_closed_request", "The client closed the connection.")
    return task.result()


def scheduler_error(exc: SchedulerError, request_id: str = "") -> PipelineError:
    """The pipeline's word for each of the scheduler's refusals and failures."""
    if isinstance(exc, RequestTooLarge):
        return PipelineError(
            "too_many_sentences",
            f"About {exc.sentences} sentences; at most {exc.limit} per request "
            "(MAX_REQUEST_SENTENCES). Send the texts in several requests.",
            "text",
        )
    if isinstance(exc, QueueFull):
        return PipelineError("queue_full", "Too many sentences waiting; retry later.",
                             retry_after=exc.retry_after)
    if isinstance(exc, ShuttingDown):
        return PipelineError("shutting_down", "The service is shutting down.", retry_after=5)
    if isinstance(exc, SchedulerFailed):
        return PipelineError("unavailable", "The translation workers failed.", retry_after=5)
    if isinstance(exc, WorkerRestarted):
        return PipelineError(
            "worker_restarted",
            "The worker translating this request failed and was restarted; retry.",
            retry_after=1,
        )
    if isinstance(exc, TranslationFailed):
        return PipelineError(
            "translation_failed",
            "A sentence of this request failed in the decoder, also when retried alone "
            f"(request id {exc.request_id or request_id}).",
        )
    if isinstance(exc, ModelLoadFailed):
        return PipelineError(
            "model_unavailable",
            f"The model of {', '.join(exc.pairs)} (bundle {exc.bundle}) could not be loaded: "
            f"{exc.cause}. Other pairs are unaffected; it is tried again in "
            f"{exc.retry_after} s (reinstall it with translate-models if it stays broken).",
            retry_after=exc.retry_after,
        )
    if isinstance(exc, DeadlineExceeded):
        return PipelineError(
            "timeout",
            "The translation did not finish within the request timeout; it was abandoned.",
        )
    return PipelineError("internal_error", str(exc))
