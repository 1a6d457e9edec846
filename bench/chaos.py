"""Reliability under abuse: a bounded run of the ways a service in production gets hurt.

Phases, each about ``--seconds`` long, against one server (phases that need other settings get
a server of their own, started beside it and stopped after):

1. capacity: 64 clients, one sentence a request, as fast as answers come (sentences/s);
2. overload: requests arriving at 3x that rate (open loop: arrivals do not wait for answers);
   200, 429 (queue full) and 503 (event loop lagging) counted apart;
3. the largest request the limits allow (MAX_REQUEST_SENTENCES sentences) beside 8 clients
   sending one sentence at a time;
4. slow clients: idle connections and connections sending their request a byte a second,
   while 4 normal clients send requests;
5. html: 4 clients sending ``format: html`` documents of ~48,000 characters (paragraphs,
   headings, links, bold, lists, built from held-out sentences; on a server of its own with
   MAX_CHARS=50000 and REQUEST_TIMEOUT_S=120), while a probe GETs /health and /ready every
   100 ms, on a new connection each time as the kubelet does: the probes' latency, and how
   many took over 100 ms and over 2 s (the readiness probe's timeoutSeconds in
   deploy/k8s/base/deployment.yaml; the liveness probe's is 5 s);
6. untranslatables: a client sending 5 texts of ~650 URLs, e-mail addresses and numbers
   each (within MAX_CHARS and MAX_REQUEST_CHARS), every answer checked: each item must come
   back exactly as often as sent (counted by regex over input and output, as a reader or a
   linkifier would take them apart: an item glued to the next, ``https://a.io/x1;42``, is one
   lost and another invented; how many of the lost are still there as substrings is told);
7. an injected decoder fault (``--faults``, only on a server this script starts: it serves
   through ``tests/faults.py``'s engine wrapper, which fails every step with one chosen
   sentence in the batch; the service itself has no switch for it): 16 clients, every tenth
   request carries that sentence;
8. poison (``--faults``): waves of 4 different poison sentences at once (each fails any step
   it is in; a fresh four each wave while the 64 last, then the same again), beside 16
   clients sending innocent sentences: the innocents' statuses, the poisons', the longest
   gap between two innocent answers, and /health and /ready probed every 100 ms;
9. outage (``--faults``): 16 clients while every decoder step, whatever its sentences, fails
   for 0.1 s, then 0.25 s, in turn, one outage a second: the statuses, the sentences failed
   (from /metrics), and /health and /ready probed every 100 ms and after;
10. conncap: a server of its own with MAX_CONNECTIONS=40, and 48 closed-loop clients, each
   on its own kept-alive connection (waiting Retry-After, at most 1 s, after a 503): the
   server's ``translate_http_connections_closed_total`` by reason from /metrics after;
11. documents: ``--documents`` plain-text documents of ``--document-chars`` characters (held-out
    sentences, paragraphs of 10 to 2,000 sentences: more than one request holds) uploaded at
    once to ``/translate/document``, while 8 clients send one sentence at a time and /health
    is probed: documents accepted (202) and completed, the interactive requests' statuses and
    latencies while the documents translate, and the probes;
12. hostile: the worst file of each format the limits let through, and the hostile ones
    (bench/document_memory.py's cases: lying zip headers, zip bombs, deep nesting, millions
    of empty elements, one huge paragraph), each uploaded twice at once, while /health is
    probed, on a server of its own: the statuses, and the peak resident memory of the server
    and of its children (its document workers);
13. glossary: a 100,000-entry glossary created (DeepL's ``/v2/glossaries``, 3.5 MB), then
    used by 2 clients (``glossary_id``) and sent inline (``glossary``, 100,000 entries) by
    one, while /health is probed;
14. SIGTERM under load (only on a server this script starts): 32 clients, the signal after a
    second, until the server exits.

For each phase: the responses by status, lost requests (sent, and no HTTP answer came: a
connection reset or a client timeout), connections refused, the 200s' median and p99 latency,
and the resident memory of the server the phase ran on, after it (on a server this script
starts). It prints figures and asserts nothing. The generator raises its own open-file limit
to the hard limit, so that no request is lost to the generator's own EMFILE.

    python bench/chaos.py                          # starts a server from MODEL_DIR
    python bench/chaos.py --faults --seconds 10    # also the injected faults
    python bench/chaos.py --url http://localhost:8000 --skip sigterm
    python bench/chaos.py --env MAX_QUEUE=256 --skip largest   # a queue that fills in seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import itertools
import json
import multiprocessing
import os
import random
import re
import resource
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

# This checkout's service and tests come first: an installed copy (``pip install -e`` of another
# checkout) would otherwise be what the --faults server serves.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fairness import as_texts, long_sentences
from load import DEFAULT_TESTS, ROOT, Server, read_sentences

from service.text import estimate_sentences

POISON = "The chaos monkey breaks this very sentence."
# The poison phase's sentences, four a wave: words only (digits would be masked as
# untranslatables, and the server would tokenize another sentence than the one registered).
_ANIMALS = ("monkey", "badger", "heron", "otter", "weasel", "magpie", "ferret", "raven")
_THINGS = ("kettle", "lantern", "ledger", "compass", "bridge", "harbour", "orchard", "tower")
POISONS = [f"The {animal} quietly ruins the {thing} again." for animal in _ANIMALS
           for thing in _THINGS]
PHASES = ("capacity", "overload", "largest", "slow", "html", "untranslatables", "fault",
          "poison", "outage", "conncap", "documents", "hostile", "glossary", "sigterm")
# How long every decoder step fails in the outage phase, in turn; the file whose existence
# makes them fail (tests/faults.py), named to the --faults server in its environment.
OUTAGES = (0.1, 0.25)
OUTAGE_FILE = "CHAOS_OUTAGE_FILE"
_FAILED = re.compile(r'^translate_sentences_total\{outcome="failed",pair="[^"]+"\} (\S+)$',
                     re.MULTILINE)
# Settings of the server a phase runs on, when they differ from the main server's.
# html: a 48,000-character document is ~10 s of a shared 2-core machine's decoding, four at
# once ~40 s, past the default 30 s deadline; the phase is about the probes, not the deadline.
# hostile: its accepted files (500,000 characters each) would translate for many minutes
# after it; on a server of its own they stop with it.
PHASE_ENV = {"html": {"MAX_CHARS": "50000", "REQUEST_TIMEOUT_S": "120"},
             "conncap": {"MAX_CONNECTIONS": "40"}, "hostile": {}}
HTML_CHARS = 48_000  # below MAX_CHARS and MAX_REQUEST_CHARS (50,000)
HTML_SENTENCES = 440  # below MAX_REQUEST_SENTENCES (512), as the server estimates them
ITEM_CHARS = 9_900  # a text of URLs, e-mail addresses and numbers, below MAX_CHARS (10,000)
_CLOSED = re.compile(r'^translate_http_connections_closed_total\{reason="([^"]+)"\} (\S+)$',
                     re.MULTILINE)
# Items the service must leave alone, as the untranslatables phase writes them. Independent
# of service/placeholders.py: a URL ends before trailing punctuation and whitespace.
_ITEMS = re.compile(
    r"https?://[^\s<>\"]+?(?=[.,;:!?)\"]*(?:\s|$))"
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
    r"|(?<![\w.,/@-])\d+(?![\w@])"
)


@dataclass
class Tally:
    phase: str
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lost: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)  # error codes of the non-200s
    refused: int = 0  # connections not accepted (no request was sent)
    seconds: float = 0.0
    note: str = ""

    def record(self, status: int, seconds: float) -> None:
        self.statuses[str(status)] += 1
        if status == 200:
            self.latencies.append(seconds)

    def line(self, memory: str) -> str:
        ordered = sorted(self.latencies)
        p50 = f"{1000 * statistics.median(ordered):.0f}" if ordered else "-"
        p99 = f"{1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]:.0f}" \
            if ordered else "-"
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(self.statuses.items())) or "-"
        lost = sum(self.lost.values())
        detail = f" ({', '.join(f'{k} {v}' for k, v in self.lost.items())})" if lost else ""
        refused = f", {self.refused} refused connections" if self.refused else ""
        return (f"{self.phase:<15} {self.seconds:>5.1f} s  {statuses:<24} lost {lost}{detail}"
                f"{refused}  p50 {p50} ms  p99 {p99} ms  {memory}  {self.note}").rstrip()


def counted(counter: Counter[str]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(counter.items())) or "-"


async def exchange(client: aiohttp.ClientSession, tally: Tally, payload: dict | bytes
                   ) -> tuple[int, bytes, float] | None:
    """POST /translate (``payload`` a JSON body, or one already serialised): (status, body,
    Retry-After) or None when no answer came."""
    started = time.perf_counter()
    sent = ({"data": payload, "headers": {"Content-Type": "application/json"}}
            if isinstance(payload, bytes) else {"json": payload})
    try:
        async with client.post("/translate", **sent) as response:
            body = await response.read()
    except aiohttp.ClientConnectorError:
        tally.refused += 1
        return None
    except (aiohttp.ClientError, TimeoutError) as exc:
        kind = type(exc).__name__
        if isinstance(exc, aiohttp.ClientOSError):  # which: the reset, the write, ...
            message = str(exc).removeprefix(f"[Errno {exc.errno}] ").split(" for http")[0]
            kind += f" ({message[:40]})"
        tally.lost[kind] += 1
        return None
    tally.record(response.status, time.perf_counter() - started)
    if response.status != 200:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            tally.codes[json.loads(body)["error"]["code"]] += 1
    try:
        retry_after = float(response.headers.get("Retry-After", 0))
    except ValueError:
        retry_after = 0.0
    return response.status, body, retry_after


async def post(client: aiohttp.ClientSession, tally: Tally, payload: dict | bytes,
               ) -> int | None:
    answer = await exchange(client, tally, payload)
    return answer[0] if answer else None


async def closed_loop(client, tally: Tally, texts: list[str], clients: int, until: float,
                      pick=None, answered: list[float] | None = None,
                      options: dict | None = None) -> None:
    async def one(seed: int) -> None:
        pool = random.Random(seed)
        while time.monotonic() < until:
            text = pick(pool) if pick else pool.choice(texts)
            status = await post(client, tally, {"text": text, **(options or {})})
            if status == 200 and answered is not None:
                answered.append(time.monotonic())

    await asyncio.gather(*(one(i) for i in range(clients)))


class Probe:
    """GET /health and /ready every ``every`` seconds, each on a new connection (as the kubelet
    probes), until stopped; their statuses and latencies. The probes run in a process of their
    own, as the kubelet does: probing from the load generator's event loop would time that
    loop's own backlog too."""

    def __init__(self, url: str, every: float = 0.1) -> None:
        self.url = url
        self.every = every
        self.statuses: dict[str, Counter[str]] = {"/health": Counter(), "/ready": Counter()}
        self.latencies: list[float] = []
        self.sent: list[float] = []  # seconds from the first probe, one per latency
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results, self._sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_probe, daemon=True, args=(
            url, every, tuple(self.statuses), self._stop, self._sender))

    def __enter__(self) -> Probe:
        self._process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        statuses, self.latencies, self.sent = self._results.recv()
        self.statuses = {path: Counter(counts) for path, counts in statuses.items()}
        self._process.join(10)

    def summary(self, after: float = 0.0, label: str = "") -> str:
        """Latencies of the probes sent ``after`` seconds into the run (all by default)."""
        ordered = sorted(t for t, at in zip(self.latencies, self.sent, strict=True) if at >= after)
        if not ordered:
            return "no probes"
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        slow = [at for t, at in zip(self.latencies, self.sent, strict=True)
                if t > 0.1 and at >= after]
        over = len(slow), sum(t > 2 for t in ordered)
        statuses = "; ".join(f"{path} {counted(c)}" for path, c in self.statuses.items())
        return (f"probes{label} {statuses if not after else f'{len(ordered)}'}: "
                f"p50 {1000 * statistics.median(ordered):.0f} ms, "
                f"p99 {1000 * p99:.0f} ms, max {1000 * ordered[-1]:.0f} ms, {over[0]} over 100 ms"
                + (f" (sent at {', '.join(f'{t:.1f}' for t in slow[:12])} s)" if slow else "")
                + f", {over[1]} over 2 s")


def _probe(url: str, every: float, paths: tuple[str, ...], stop, results) -> None:
    """Probe's loop, in its own process: blocking requests on a new connection each."""
    parts = urlsplit(url)
    statuses: dict[str, Counter[str]] = {path: Counter() for path in paths}
    latencies: list[float] = []
    sent: list[float] = []  # when each was sent, in seconds from the first
    due = first = time.monotonic()
    while not stop.is_set():
        for path in paths:
            started = time.perf_counter()
            sent.append(time.monotonic() - first)
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            try:
                connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                outcome = str(response.status)
            except OSError as exc:
                outcome = type(exc).__name__
            finally:
                connection.close()
            latencies.append(time.perf_counter() - started)
            statuses[path][outcome] += 1
        due += every
        stop.wait(max(0.0, due - time.monotonic()))
    results.send(({path: dict(counts) for path, counts in statuses.items()}, latencies, sent))


async def capacity(client, texts: list[str], seconds: float) -> tuple[Tally, float]:
    tally = Tally("capacity")
    started = time.monotonic()
    await closed_loop(client, tally, texts, 64, started + seconds)
    tally.seconds = time.monotonic() - started
    rate = len(tally.latencies) / tally.seconds
    tally.note = f"{rate:.0f} sentences/s"
    return tally, rate


async def overload(client, url: str, texts: list[str], seconds: float, rate: float,
                   capacity: float) -> Tally:
    """Poisson arrivals at ``rate`` a second, none waiting for another's answer, while /health
    and /ready are probed as in the html phase (the probes must stay fast with the queue full).
    Good-put: the 200s a second over the phase, its tail of answers included, against the
    ``capacity`` phase's rate."""
    tally = Tally("overload")
    pool = random.Random(3)
    started = time.monotonic()
    tasks = []
    due = started
    full: list[float] = []  # when 429s came, from the phase's start

    async def one(text: str) -> None:
        if await post(client, tally, {"text": text}) == 429:
            full.append(time.monotonic() - started)

    with Probe(url) as probe:
        while (now := time.monotonic()) < started + seconds:
            while due <= now:  # catch up when the client itself falls behind the schedule
                tasks.append(asyncio.ensure_future(one(pool.choice(texts))))
                due += pool.expovariate(rate)
            await asyncio.sleep(due - now)
        sent = len(tasks)
        await asyncio.gather(*tasks)
    tally.seconds = time.monotonic() - started
    shed = ", ".join(f"{status} {tally.statuses[status]}" for status in ("200", "429", "503"))
    codes = f" ({counted(tally.codes)})" if tally.codes else ""
    goodput = tally.statuses["200"] / tally.seconds
    tally.note = (f"{rate:.0f} requests/s meant, {sent / seconds:.0f} sent; {shed}{codes}; "
                  f"good-put {goodput:.0f}/s = {goodput / capacity:.0%} of capacity; "
                  + probe.summary()
                  + (f"; the queue full (429s) from {min(full):.1f} s; "
                     + probe.summary(min(full), " from then") if full else ""))
    return tally


async def largest(client, texts: list[str], seconds: float, sentences: int,
                  max_texts: int) -> Tally:
    tally = Tally("largest")
    # Single short sentences, so that the request is within MAX_REQUEST_SENTENCES and
    # MAX_REQUEST_CHARS both: test lines may hold several sentences (Bible verses).
    single = [t for t in texts if len(t) <= 90 and estimate_sentences(t) == 1]
    large = as_texts(long_sentences(single, sentences, 1), max_texts)
    started = time.monotonic()
    big = Tally("big")
    big_task = asyncio.ensure_future(post(client, big, {"text": large}))
    await closed_loop(client, tally, texts, 8, started + seconds)
    await big_task
    tally.seconds = time.monotonic() - started
    outcome = next(iter(big.statuses), "lost")
    big_seconds = big.latencies[0] if big.latencies else None
    tally.note = (f"the {sentences}-sentence request: {outcome}"
                  + (f" in {big_seconds:.1f} s" if big_seconds else ""))
    return tally


async def slow(client, url: str, texts: list[str], seconds: float, idle: int,
               trickling: int) -> Tally:
    """Idle sockets and sockets sending a request a byte a second, beside normal clients."""
    tally = Tally("slow")
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = json.dumps({"text": "slow"}).encode()
    request = (f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    closed = Counter()
    until = time.monotonic() + seconds

    async def hold(send: bool) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            closed["refused"] += 1
            return
        try:
            for byte in request if send else b"":
                if time.monotonic() >= until:
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)
            while time.monotonic() < until:
                if reader.at_eof():
                    closed["closed by server"] += 1
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1024), 0.5)
        except OSError:
            closed["closed by server"] += 1
        finally:
            writer.close()

    started = time.monotonic()
    holders = [asyncio.ensure_future(hold(False)) for _ in range(idle)]
    holders += [asyncio.ensure_future(hold(True)) for _ in range(trickling)]
    await asyncio.sleep(1)  # connections open before the normal clients start
    await closed_loop(client, tally, texts, 4, until)
    await asyncio.gather(*holders)
    tally.seconds = time.monotonic() - started
    kept = idle + trickling - sum(closed.values())
    tally.note = ", ".join([f"{idle} idle + {trickling} trickling sockets: {kept} held open "
                            "to the end", *(f"{v} {k}" for k, v in closed.items())])
    return tally


def html_document(sentences: list[str], pool: random.Random, chars: int = HTML_CHARS,
                  most_sentences: int = HTML_SENTENCES) -> str:
    """A web page's body of held-out sentences: headings, paragraphs with links and bold
    words, and lists; at most ``chars`` characters and ``most_sentences`` sentences (as the
    server estimates them from the text)."""
    parts: list[str] = []
    length = count = 0

    def sentence() -> str:
        return pool.choice(sentences)

    def linked(text: str) -> str:
        words = text.split(" ")
        if len(words) < 4:
            return f'<span class="s">{text}</span>'
        i = pool.randrange(len(words) - 2)
        span = " ".join(words[i:i + 2])
        if pool.random() < 0.6:
            href = (f"https://www.example.org/{pool.choice(('docs', 'news', 'help'))}/"
                    f"{pool.randrange(10**6)}?utm_source=newsletter&amp;lang=en#section-{i}")
            span = (f'<a href="{href}" class="inline-link" rel="noopener" '
                    f'target="_blank">{span}</a>')
        else:
            span = f"<b>{span}</b>"
        return f'<span class="s">{" ".join([*words[:i], span, *words[i + 2:]])}</span>'

    while True:
        kind = pool.random()
        if kind < 0.1:
            chosen = [sentence()]
            block = f'<h2 id="s{len(parts)}">{chosen[0].rstrip(".")}</h2>\n'
        elif kind < 0.3:
            chosen = [sentence() for _ in range(pool.randint(3, 5))]
            items = "".join(f"  <li>{linked(s)}</li>\n" for s in chosen)
            block = f'<ul class="list">\n{items}</ul>\n'
        else:
            chosen = [sentence() for _ in range(pool.randint(2, 4))]
            block = f'<p class="body">{" ".join(linked(s) for s in chosen)}</p>\n'
        estimated = sum(map(estimate_sentences, chosen))
        if length + len(block) > chars or count + estimated > most_sentences:
            return '<div class="article">\n' + "".join(parts) + "</div>"
        parts.append(block)
        length += len(block)
        count += estimated


async def html(client, url: str, texts: list[str], seconds: float) -> Tally:
    tally = Tally("html")
    pool = random.Random(5)
    documents = [html_document(texts, pool) for _ in range(8)]
    started = time.monotonic()
    with Probe(url) as probe:
        await closed_loop(client, tally, [], 4, started + seconds,
                          pick=lambda p: documents[p.randrange(len(documents))],
                          options={"format": "html"})
    tally.seconds = time.monotonic() - started
    size = statistics.mean(map(len, documents))
    tally.note = f"documents of {size:,.0f} characters; {probe.summary()}"
    return tally


def untranslatable_text(pool: random.Random, chars: int = ITEM_CHARS) -> tuple[str, int]:
    """A text of URLs, e-mail addresses and numbers with a few words between them, within
    ``chars``; and how many items it holds."""
    def letters(low: int, high: int) -> str:
        return "".join(pool.choice("abcdefghijklmnopqrstuvwxyz")
                       for _ in range(pool.randint(low, high)))

    def item() -> str:
        roll = pool.random()
        if roll < 0.5:
            return (f"https://{letters(1, 3)}.{pool.choice(('io', 'de', 'org'))}/"
                    f"{letters(1, 1)}{pool.randrange(100)}")
        if roll < 0.65:
            return f"{letters(2, 4)}@{letters(1, 3)}.{pool.choice(('de', 'com'))}"
        return str(pool.randrange(1, 100_000))

    openers = ("See", "Mirrors:", "Write to", "Links:", "Also")
    text, items = "", 0
    while True:
        sentence = [pool.choice(openers)]
        for _ in range(pool.randint(10, 25)):
            sentence.append(item() + pool.choice((",", ",", "", " and", " or", ";")))
        words = " ".join(sentence).rstrip(",;") + "."
        line = f"{text} {words}" if text else words
        if len(line) > chars:
            return text, items
        text = line
        items += len(sentence) - 1


def substrings(item: str, text: str) -> int:
    """How often ``item`` stands in ``text``, glued to anything but a longer number."""
    before = r"(?<!\d)" if item[0].isdigit() else ""
    after = r"(?!\d)" if item[-1].isdigit() else ""
    return len(re.findall(before + re.escape(item) + after, text))


async def untranslatables(client, seconds: float, clients: int, texts: int = 5) -> Tally:
    """Requests of ``texts`` texts packed with URLs, e-mail addresses and numbers; each answer
    must hold every item exactly as often as the request did."""
    tally = Tally("untranslatables")
    sent = Counter()  # items in the requests that were answered with 200
    lost = Counter()
    invented = Counter()
    glued = 0  # of the lost, items still in the output as substrings (glued to a neighbour)
    wrong = 0  # answers with any item lost or invented
    items_per_text: list[int] = []

    async def one(seed: int) -> None:
        nonlocal wrong, glued
        pool = random.Random(seed)
        while time.monotonic() < until:
            made = [untranslatable_text(pool) for _ in range(texts)]
            items_per_text.extend(n for _, n in made)
            request = [text for text, _ in made]
            answer = await exchange(client, tally, {"text": request})
            if answer is None or answer[0] != 200:
                continue
            outputs = [t["text"] for t in json.loads(answer[1])["translations"]]
            for source, output in zip(request, outputs, strict=True):
                before = Counter(m.group() for m in _ITEMS.finditer(source))
                after = Counter(m.group() for m in _ITEMS.finditer(output))
                sent.update(before)
                missing, extra = before - after, after - before
                glued += sum(min(n, substrings(item, output) - after[item])
                             for item, n in missing.items())
                lost.update(missing)
                invented.update(extra)
                wrong += bool(missing or extra)

    started = time.monotonic()
    until = started + seconds
    await asyncio.gather(*(one(1000 + i) for i in range(clients)))
    tally.seconds = time.monotonic() - started
    per_text = statistics.mean(items_per_text) if items_per_text else 0
    examples = ", ".join(list(lost)[:2] + list(invented)[:2])
    tally.note = (f"{texts} texts of ~{per_text:.0f} items a request; "
                  f"{sum(sent.values())} items answered: {sum(lost.values())} lost "
                  f"({glued} of them there but glued to a neighbour), "
                  f"{sum(invented.values())} invented, {wrong} texts not intact"
                  + (f" (e.g. {examples})" if examples else ""))
    return tally


async def fault(client, texts: list[str], seconds: float) -> Tally:
    tally = Tally("fault")
    poisoned = Tally("poisoned")
    counter = iter(range(10**9))

    async def one() -> None:
        while time.monotonic() < until:
            if next(counter) % 10 == 0:
                await post(client, poisoned, {"text": POISON})
            else:
                await post(client, tally, {"text": random.choice(texts)})

    started = time.monotonic()
    until = started + seconds
    await asyncio.gather(*(one() for _ in range(16)))
    tally.seconds = time.monotonic() - started
    async with client.get("/ready") as ready:
        ready_status = ready.status
    statuses = " ".join(f"{k}:{v}" for k, v in sorted(poisoned.statuses.items()))
    tally.note = f"poisoned requests: {statuses}; /ready {ready_status} after"
    return tally


async def poison(client, url: str, texts: list[str], seconds: float) -> Tally:
    """Waves of four different poison sentences at once beside 16 innocent clients."""
    tally = Tally("poison")
    poisoned = Tally("poisoned")
    answered: list[float] = []
    waves = 0

    async def poisoner() -> None:
        nonlocal waves
        while time.monotonic() < until:
            first = 4 * waves % len(POISONS)
            wave = POISONS[first:first + 4]
            waves += 1
            await asyncio.gather(*(post(client, poisoned, {"text": s}) for s in wave))
            await asyncio.sleep(0.1)

    started = time.monotonic()
    until = started + seconds
    with Probe(url) as probe:
        await asyncio.gather(poisoner(), closed_loop(client, tally, texts, 16, until,
                                                     answered=answered))
    tally.seconds = time.monotonic() - started
    marks = [started, *sorted(answered)]
    gap = max((b - a for a, b in itertools.pairwise(marks)), default=tally.seconds)
    codes = f" ({counted(poisoned.codes)})" if poisoned.codes else ""
    lost = sum(poisoned.lost.values())
    tally.note = (f"{waves} waves of 4 ({min(4 * waves, len(POISONS))} different poisons): "
                  f"{counted(poisoned.statuses)}{codes}, {lost} lost; longest gap between "
                  f"innocent answers {1000 * gap:.0f} ms; {probe.summary()}")
    return tally


async def failed_sentences(client) -> float:
    async with client.get("/metrics") as response:
        return sum(float(value) for value in _FAILED.findall(await response.text()))


async def outage(client, url: str, texts: list[str], seconds: float, trigger: Path) -> Tally:
    """16 innocent clients while every decoder step fails for a while, once a second."""
    tally = Tally("outage")
    failed_before = await failed_sentences(client)
    outages = 0

    async def breaker() -> None:
        nonlocal outages
        for length in itertools.cycle(OUTAGES):
            await asyncio.sleep(0.75)
            if time.monotonic() + length >= until:
                return
            trigger.touch()
            await asyncio.sleep(length)
            trigger.unlink()
            outages += 1

    started = time.monotonic()
    until = started + seconds
    with Probe(url) as probe:
        await asyncio.gather(breaker(), closed_loop(client, tally, texts, 16, until))
    tally.seconds = time.monotonic() - started
    failed = await failed_sentences(client) - failed_before
    after = []
    for path in ("/health", "/ready"):
        async with client.get(path) as response:
            after.append(f"{path} {response.status}")
    tally.note = (f"{outages} outages of every step ({' s, '.join(map(str, OUTAGES))} s in "
                  f"turn): {failed:.0f} sentences failed; {', '.join(after)} after; "
                  f"{probe.summary()}")
    return tally


async def conncap(url: str, texts: list[str], seconds: float, clients: int,
                  client_timeout: float) -> Tally:
    """Closed-loop clients, each on its own kept-alive connection, more than MAX_CONNECTIONS."""
    tally = Tally("conncap")
    timeout = aiohttp.ClientTimeout(total=client_timeout)
    sessions = [aiohttp.ClientSession(url, timeout=timeout,
                                      connector=aiohttp.TCPConnector(limit=1))
                for _ in range(clients)]

    lost_at: list[float] = []  # seconds into the phase

    async def one(session: aiohttp.ClientSession, seed: int) -> None:
        pool = random.Random(seed)
        while time.monotonic() < until:
            lost, sent_at = sum(tally.lost.values()), time.monotonic() - started
            answer = await exchange(session, tally, {"text": pool.choice(texts)})
            if sum(tally.lost.values()) > lost:
                lost_at.append(sent_at)
            if answer is None:
                await asyncio.sleep(0.05)
            elif answer[0] in (429, 503):
                await asyncio.sleep(min(answer[2] or 0.1, 1.0))

    started = time.monotonic()
    until = started + seconds
    try:
        await asyncio.gather(*(one(s, i) for i, s in enumerate(sessions)))
    finally:
        for session in sessions:
            await session.close()
    tally.seconds = time.monotonic() - started
    closed = "?"
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with aiohttp.ClientSession(url, timeout=timeout) as session, \
                session.get("/metrics") as response:
            found = _CLOSED.findall(await response.text())
            closed = " ".join(f"{reason}:{float(v):.0f}" for reason, v in found) or "-"
    codes = f" ({counted(tally.codes)})" if tally.codes else ""
    when = (f"; the lost sent {min(lost_at):.2f}-{max(lost_at):.2f} s into the phase"
            if lost_at else "")
    tally.note = (f"{clients} clients, MAX_CONNECTIONS 40; non-200{codes}; server closed "
                  f"connections: {closed}{when}")
    return tally


async def sigterm(client, texts: list[str], server: Server) -> Tally:
    tally = Tally("sigterm")
    started = time.monotonic()

    async def one(seed: int) -> None:
        pool = random.Random(seed)
        while server.process.poll() is None:
            status = await post(client, tally, {"text": pool.choice(texts)})
            if status is None:
                await asyncio.sleep(0.05)

    clients = [asyncio.ensure_future(one(i)) for i in range(32)]
    await asyncio.sleep(1)
    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    await asyncio.gather(*clients)
    tally.seconds = time.monotonic() - started
    tally.note = f"exited {time.monotonic() - signalled:.1f} s after SIGTERM"
    return tally


def memory(server: Server | None) -> str:
    measured = server.memory_mib() if server is not None else None
    return f"rss {measured[0]:.0f} MiB (peak {measured[1]:.0f})" if measured else ""


def worker_peaks(server: Server | None) -> list[float]:
    """The peak resident memory (MiB) of each child process of the server (its document
    workers), from Linux's /proc."""
    if server is None:
        return []
    peaks = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines()
                          if ":" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(server.process.pid) and "VmHWM" in fields:
            peaks.append(int(fields["VmHWM"].split()[0]) / 1024)
    return peaks


def plain_document(sentences: list[str], pool: random.Random, chars: int) -> str:
    """Paragraphs of held-out sentences, 10 to 2,000 sentences each, about ``chars`` in all."""
    paragraphs, length = [], 0
    while length < chars:
        count = pool.choice((10, 40, 200, 700, 2000))
        paragraph = " ".join(pool.choice(sentences) for _ in range(count))
        paragraph = paragraph[:chars - length]
        paragraphs.append(paragraph)
        length += len(paragraph) + 2
    return "\n\n".join(paragraphs)


async def documents(client, url: str, texts: list[str], sentences: list[str], count: int,
                    chars: int, timeout: float) -> Tally:
    """``count`` documents uploaded at once, each polled until done or failed (at most
    ``timeout`` seconds), beside 8 interactive clients: the tally is theirs, the note the
    documents' figures and the probes'."""
    tally = Tally("documents")
    pool = random.Random(9)
    files = [plain_document(sentences, pool, chars) for _ in range(count)]
    uploads: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    finished = asyncio.Event()
    started = time.monotonic()

    async def one(index: int, text: str) -> None:
        form = aiohttp.FormData()
        form.add_field("target_lang", "de")
        form.add_field("file", text.encode(), filename=f"d{index}.txt")
        try:
            async with client.post("/translate/document", data=form) as response:
                answer = await response.json(content_type=None)
                uploads[str(response.status)] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            uploads[type(exc).__name__] += 1
            return
        if response.status != 202:
            return
        status_url = f"/translate/document/{answer['document_id']}"
        key = {"document_key": answer["document_key"]}
        while time.monotonic() < started + timeout:
            await asyncio.sleep(1)
            try:
                async with client.get(status_url, params=key) as response:
                    status = (await response.json(content_type=None)).get("status", "?")
            except (aiohttp.ClientError, TimeoutError):
                continue  # asked again a second later
            if status in ("done", "error"):
                outcomes[status] += 1
                return
        outcomes["unfinished"] += 1

    async def all_documents() -> None:
        await asyncio.gather(*(one(i, text) for i, text in enumerate(files)))
        finished.set()

    with Probe(url) as probe:
        work = asyncio.ensure_future(all_documents())
        while not finished.is_set():
            await closed_loop(client, tally, texts, 8, time.monotonic() + 5)
        await work
    tally.seconds = time.monotonic() - started
    tally.note = (f"{count} documents of {chars:,} characters: uploads {counted(uploads)}, "
                  f"completed {counted(outcomes)}; {probe.summary()}")
    return tally


async def hostile(client, url: str, server: Server | None, chars: int) -> Tally:
    """Each of bench/document_memory.py's cases uploaded twice at once: the statuses by
    case, and the memory peaks."""
    from document_memory import CASES, multipart

    tally = Tally("hostile")
    by_case: list[str] = []
    started = time.monotonic()
    with Probe(url) as probe:
        for name, (filename, build) in CASES.items():
            data = await asyncio.to_thread(build, chars)
            body, content_type = multipart(filename, data)

            async def upload(body: bytes, content_type: str) -> str:
                began = time.perf_counter()
                try:
                    async with client.post("/translate/document", data=body,
                                           headers={"Content-Type": content_type}) as response:
                        await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    tally.lost[type(exc).__name__] += 1
                    return "lost"
                tally.record(response.status, time.perf_counter() - began)
                return str(response.status)

            statuses = await asyncio.gather(upload(body, content_type),
                                            upload(body, content_type))
            by_case.append(f"{name} {'/'.join(statuses)}")
    tally.seconds = time.monotonic() - started
    peaks = worker_peaks(server)
    workers = (f"; worker peaks {', '.join(f'{p:.0f}' for p in sorted(peaks))} MiB"
               if peaks else "")
    tally.note = f"{'; '.join(by_case)}{workers}; {probe.summary()}"
    return tally


async def glossary(client, url: str, texts: list[str], seconds: float,
                   entries: int = 100_000) -> Tally:
    """A glossary of ``entries`` created, used by glossary_id and sent inline, beside the
    probes."""
    tally = Tally("glossary")
    tsv = "\n".join(f"term{i} word\tBegriff{i} Wort" for i in range(entries))
    # Serialised once: the load generator shares the server's two cores, and 3 MB of JSON
    # written for every request would take CPU from the server that a remote client does not.
    inline = json.dumps({f"term{i} word": f"Begriff{i} Wort" for i in range(entries)})
    notes = []
    started = time.monotonic()
    with Probe(url) as probe:
        began = time.perf_counter()
        async with client.post("/v2/glossaries", json={
                "name": "large", "source_lang": "en", "target_lang": "de",
                "entries": tsv, "entries_format": "tsv"}) as response:
            created = await response.json(content_type=None)
            tally.record(response.status, time.perf_counter() - began)
        notes.append(f"created {response.status} in {time.perf_counter() - began:.1f} s")
        glossary_id = created.get("glossary_id")
        until = time.monotonic() + seconds

        async def by_id() -> None:
            while time.monotonic() < until:
                await post(client, tally, {"text": random.choice(texts) + " term7 word.",
                                           "target_lang": "de", "glossary_id": glossary_id})

        async def by_value() -> None:
            while time.monotonic() < until:
                await post(client, tally, (f'{{"text": {json.dumps(random.choice(texts))}, '
                                           f'"target_lang": "de", "glossary": {inline}}}'
                                           ).encode())

        await asyncio.gather(by_id(), by_id(), by_value())
    tally.seconds = time.monotonic() - started
    tally.note = f"{'; '.join(notes)}; {probe.summary()}"
    return tally


def start_server(args: argparse.Namespace, extra: dict[str, str] | None = None) -> Server:
    command = [str(Path(__file__).resolve()), "--serve-with-faults"] if args.faults else None
    env = dict(item.split("=", 1) for item in args.env)
    if args.faults:
        env[OUTAGE_FILE] = str(args.outage_file)
    server = Server({"MODEL_DIR": str(args.model_dir), **env, **(extra or {})}, command)
    server.wait_ready()
    return server


async def run(args: argparse.Namespace, url: str, server: Server | None) -> None:
    sentences = read_sentences(args.test)
    texts = [s for s in sentences if len(s.split()) <= 20]
    timeout = aiohttp.ClientTimeout(total=args.client_timeout)
    # No connection limit: the overload phase needs its connections. Idle ones are closed
    # before the server's keep-alive timeout (5 s) can close them under a new request.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=connector) as client:
        rate = None
        for phase in PHASES:
            if phase in args.skip:
                continue
            if phase in ("fault", "poison", "outage", "sigterm", *PHASE_ENV) and server is None:
                print(f"{phase:<15} skipped: needs a server this script starts")
                continue
            if phase in ("fault", "poison", "outage") and not args.faults:
                print(f"{phase:<15} skipped: run with --faults (a server serving through "
                      "tests/faults.py; the service has no fault switch of its own)")
                continue
            own = None
            if phase in PHASE_ENV:  # a server of its own, beside the main one
                own = await asyncio.to_thread(start_server, args, PHASE_ENV[phase])
            try:
                tally = await run_phase(phase, args, client, url, server, own, texts,
                                        sentences, rate)
                if phase == "capacity":
                    tally, rate = tally
                print(tally.line(memory(own or server)), flush=True)
            finally:
                if own is not None:
                    await asyncio.to_thread(own.stop)


def own_client(own: Server, args: argparse.Namespace) -> aiohttp.ClientSession:
    """A session for a phase's server of its own, with the client timeout."""
    return aiohttp.ClientSession(own.url,
                                 timeout=aiohttp.ClientTimeout(total=args.client_timeout))


async def run_phase(phase: str, args: argparse.Namespace, client, url: str,
                    server: Server | None, own: Server | None, texts: list[str],
                    sentences: list[str], rate: float | None):
    if phase == "capacity":
        return await capacity(client, texts, args.seconds)
    if phase == "overload":
        if rate is None:
            _, rate = await capacity(client, texts, args.seconds)
        return await overload(client, url, texts, args.seconds, 3 * rate, rate)
    if phase == "largest":
        return await largest(client, texts, args.seconds, args.max_sentences, args.texts)
    if phase == "slow":
        return await slow(client, url, texts, args.seconds, args.idle, args.trickling)
    if phase == "html":
        assert own is not None
        async with own_client(own, args) as html_client:
            return await html(html_client, own.url, sentences, args.seconds)
    if phase == "untranslatables":
        return await untranslatables(client, args.seconds, args.item_clients)
    if phase == "fault":
        return await fault(client, texts, args.seconds)
    if phase == "poison":
        return await poison(client, url, texts, args.seconds)
    if phase == "outage":
        return await outage(client, url, texts, args.seconds, args.outage_file)
    if phase == "conncap":
        assert own is not None
        return await conncap(own.url, texts, args.seconds, 48, args.client_timeout)
    if phase == "documents":
        return await documents(client, url, texts, sentences, args.documents,
                               args.document_chars, args.document_timeout)
    if phase == "hostile":
        assert own is not None
        async with own_client(own, args) as hostile_client:
            return await hostile(hostile_client, own.url, own, args.document_limit)
    if phase == "glossary":
        return await glossary(client, url, texts, args.seconds)
    assert server is not None
    return await sigterm(client, texts, server)


def raise_open_file_limit() -> None:
    """The generator's own soft open-file limit up to the hard one: the overload phase's
    connections and the slow phase's sockets must not fail here with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (else one is started from MODEL_DIR)")
    parser.add_argument("--model-dir", type=Path,
                        default=Path(os.environ.get("MODEL_DIR", ROOT / "models")))
    parser.add_argument("--test", type=Path,
                        default=next((p for p in DEFAULT_TESTS if p.is_file()), DEFAULT_TESTS[-1]))
    parser.add_argument("--seconds", type=float, default=15, help="length of each phase")
    parser.add_argument("--faults", action="store_true",
                        help="serve through tests/faults.py and run the fault, poison and "
                        "outage phases")
    parser.add_argument("--skip", default="", help=f"comma-separated phases of {PHASES}")
    parser.add_argument("--max-sentences", type=int,
                        default=int(os.environ.get("MAX_REQUEST_SENTENCES", 512)))
    parser.add_argument("--texts", type=int, default=int(os.environ.get("MAX_TEXTS", 64)))
    parser.add_argument("--idle", type=int, default=300, help="idle sockets in the slow phase")
    parser.add_argument("--trickling", type=int, default=300,
                        help="sockets sending a byte a second in the slow phase")
    parser.add_argument("--item-clients", type=int, default=1,
                        help="clients in the untranslatables phase")
    parser.add_argument("--client-timeout", type=float, default=60)
    parser.add_argument("--documents", type=int, default=20,
                        help="documents uploaded at once in the documents phase")
    parser.add_argument("--document-chars", type=int, default=20_000,
                        help="characters of each document in the documents phase")
    parser.add_argument("--document-timeout", type=float, default=900,
                        help="the longest the documents phase waits for its documents")
    parser.add_argument("--document-limit", type=int,
                        default=int(os.environ.get("MAX_DOCUMENT_CHARS", 500_000)),
                        help="MAX_DOCUMENT_CHARS of the server (the hostile files' size)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the servers this script starts (e.g. MAX_QUEUE=256)")
    parser.add_argument("--serve-with-faults", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_with_faults:
        serve_with_faults()
        return
    args.skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    unknown = args.skip - set(PHASES)
    if unknown:
        parser.error(f"unknown phases in --skip: {', '.join(sorted(unknown))}")
    raise_open_file_limit()
    args.outage_file = Path(tempfile.mkdtemp(prefix="chaos-")) / "outage"
    server = None
    url = args.url
    if url is None:
        server = start_server(args)
        url = server.url
    print(f"{'phase':<15} {'time':>7}  {'responses by status':<28} lost ...")
    try:
        asyncio.run(run(args, url, server))
    finally:
        if server is not None and server.process.poll() is None:
            server.stop()


def serve_with_faults() -> None:
    """The service, configured from the environment as ``translate-serve`` is, whose engines
    fail every decoder step while POISON, or one of POISONS, is in the batch, and every step
    while the file named by OUTAGE_FILE exists (a test mode: tests/faults.py)."""
    from service.loading import default_engine
    from service.main import serve
    from service.settings import Settings
    from tests.faults import Faults, FaultyEngine

    settings = Settings()
    faults = Faults()
    if os.environ.get(OUTAGE_FILE):
        faults.broken_when = Path(os.environ[OUTAGE_FILE])

    def factory(directory: Path, settings: Settings) -> FaultyEngine:
        engine = default_engine(directory, settings)
        faults.poison = tuple(engine.tokenize(POISON))
        faults.poisons = {tuple(engine.tokenize(s)) for s in POISONS}
        return FaultyEngine(engine, faults)

    # ``serve``, as translate-serve runs: its allocator settings too (MALLOC_MMAP_THRESHOLD_KB),
    # without which the documents phase alone peaked at 1,184 MiB against 575.
    serve(settings, factory)


if __name__ == "__main__":
    main()
