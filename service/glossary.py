"""Glossaries: terms a translation must use, kept in a SQLite file so that they outlive the
process (``GlossaryStore``) or, with STATE_URL, in Redis for every replica
(``SharedGlossaryStore``), and applied to a text by ``Terms``.

A glossary holds dictionaries, each of entries source term -> target term for one language
pair (DeepL's v2 glossaries have one, its v3 "multilingual" ones several). Entries are read
from TSV or CSV (``parse_entries``, with the csv module) as DeepL's API sends them, and
checked as DeepL checks them: no empty term, no term with a tab or a line break or space at
its ends, no source term twice. Each glossary belongs to the API key that created it (all
clients share them when the service has no keys).

Applying a glossary (``Terms``, ``service.passes``): a sentence whose translation
already holds each matched term's target term is kept; the others are translated again with
each matched source term masked as an untranslatable item (``service.placeholders``) that is
put back as its target term. Terms match as whole words, case-insensitive (an entry whose
source term has capitals beyond its first letter matches that case only, so "US" is not
"us"), the longest entry first, never inside a URL, a placeholder or another item.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import csv
import hashlib
import io
import itertools
import json
import sqlite3
import threading
import unicodedata
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import ahocorasick
import regex

from service.shared_state import PREFIX, StateStore, digest, stored_owner

if TYPE_CHECKING:
    import redis.asyncio

K, V = TypeVar("K"), TypeVar("V")
FORMATS = ("tsv", "csv")
SCHEMA_VERSION = 2  # the glossaries table's layout (PRAGMA user_version)
MAX_TERM_CHARS = 1024  # the longest source or target term, stored or given inline


class GlossaryError(ValueError):
    """Entries or a glossary that cannot be accepted; the message says why."""


Pair = tuple[str, str]


@dataclass(frozen=True)
class Glossary:
    """A named set of dictionaries, one per language pair (DeepL's v3 "multilingual"
    glossary; a v2 glossary is one with a single dictionary)."""

    glossary_id: str
    name: str
    dictionaries: dict[Pair, dict[str, str]]
    creation_time: str  # ISO 8601, UTC, as DeepL writes it
    owner: str = ""

    @property
    def pair(self) -> Pair:
        """The pair of a glossary of one dictionary (DeepL's v2 view)."""
        return next(iter(self.dictionaries))

    @property
    def entry_count(self) -> int:
        return sum(map(len, self.dictionaries.values()))

    def entries_tsv(self, pair: Pair) -> str:
        """One entry a line, the lines joined by line breaks (none after the last), as
        DeepL writes them."""
        return "\n".join(f"{source}\t{target}"
                         for source, target in self.dictionaries[pair].items())


def parse_entries(text: str, entries_format: str = "tsv", max_entries: int = 0,
                  max_term_chars: int = MAX_TERM_CHARS) -> dict[str, str]:
    """{source: target} of TSV (a tab between the terms) or CSV (a comma; quoted fields as
    the csv module reads them; further columns, DeepL's optional language codes, ignored)."""
    if entries_format not in FORMATS:
        raise GlossaryError(f"Unsupported entries_format '{entries_format}': tsv or csv.")
    # Rows as they are read, never a list of them all: 100,000 lists alive at once bring on
    # a full garbage-collector pass, which holds the GIL (the event loop's too) meanwhile.
    rows: Iterable[list[str]]
    if entries_format == "tsv":
        rows = (line.split("\t") for line in text.splitlines() if line.strip())
    else:
        rows = (row for row in csv.reader(io.StringIO(text)) if any(f.strip() for f in row))
    entries: dict[str, str] = {}
    for number, row in enumerate(rows, start=1):
        if len(row) < 2 or (entries_format == "tsv" and len(row) != 2):
            raise GlossaryError(f"Entry {number} is not a source and a target term.")
        source, target = row[0], row[1]
        _check_entry(number, source, target, max_term_chars)
        if source in entries:
            raise GlossaryError(f"Entry {number} repeats the source term '{source}'.")
        entries[source] = target
    if not entries:
        raise GlossaryError("The glossary has no entries.")
    _check_size(entries, max_entries)
    return entries


def check_entries(entries: Mapping[str, str], max_entries: int,
                  max_term_chars: int = MAX_TERM_CHARS) -> None:
    """Entries given as a mapping (a request's own glossary) checked as ``parse_entries``
    checks a stored glossary's: as many entries, terms as long and of the same form (none at
    all is no glossary, not an error)."""
    _check_size(entries, max_entries)
    for number, (source, target) in enumerate(entries.items(), start=1):
        _check_entry(number, source, target, max_term_chars)


def _check_entry(number: int, source: str, target: str, max_term_chars: int) -> None:
    for term in (source, target):
        if not term or term != term.strip() or any(c in term for c in "\t\r\n"):
            raise GlossaryError(f"Entry {number} has an empty term, or one with a tab, a "
                                "line break or surrounding spaces.")
        if len(term) > max_term_chars:
            raise GlossaryError(f"Entry {number} has a term over {max_term_chars} "
                                "characters.")


def _check_size(entries: Mapping[str, str], max_entries: int) -> None:
    if max_entries and len(entries) > max_entries:
        raise GlossaryError(f"{len(entries)} entries; at most {max_entries} "
                            "(MAX_GLOSSARY_ENTRIES).")


class GlossaryStore:
    """Glossaries in a SQLite file (``":memory:"``: in the process only), one row each, its
    dictionaries as JSON (``_dump``). Each call runs in a thread: a row is one indexed read
    or write, but a large glossary's JSON takes a third of a second to write or read; a
    lock serialises the calls across threads. A row's dictionaries are read from its JSON
    once per content (``_loaded``)."""

    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            tables = self._db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
            if tables and version == 1:
                self._hash_owners()
            elif tables and version != SCHEMA_VERSION:
                self._db.close()
                raise GlossaryError(f"{self.path} holds glossaries of another layout "
                                    f"(version {version}, this service reads "
                                    f"{SCHEMA_VERSION}): move it away or use another DATA_DIR")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("PRAGMA journal_mode=WAL" if self.path != ":memory:" else
                             "PRAGMA journal_mode=MEMORY")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS glossaries (glossary_id TEXT PRIMARY KEY, "
                "owner TEXT NOT NULL, name TEXT NOT NULL, creation_time TEXT NOT NULL, "
                "dictionaries TEXT NOT NULL)")
            self._db.execute("CREATE INDEX IF NOT EXISTS by_owner ON glossaries (owner)")

    def _hash_owners(self) -> None:
        """Layout 1 kept each owner's API key as it is: replace it with its stored form."""
        owners = [row[0] for row in self._db.execute("SELECT DISTINCT owner FROM glossaries")]
        self._db.execute("BEGIN")
        for owner in owners:
            self._db.execute("UPDATE glossaries SET owner = ? WHERE owner = ?",
                             (stored_owner(owner), owner))
        self._db.execute("COMMIT")

    async def create(self, name: str, dictionaries: dict[Pair, dict[str, str]],
               owner: str = "") -> Glossary:
        glossary = Glossary(str(uuid.uuid4()), name, dict(dictionaries),
                            datetime.now(UTC).isoformat(timespec="milliseconds")
                            .replace("+00:00", "Z"), owner)

        def insert() -> None:
            dumped = _dump(glossary.dictionaries)
            with self._lock:
                self._db.execute("INSERT INTO glossaries VALUES (?, ?, ?, ?, ?)", (
                    glossary.glossary_id, stored_owner(owner), name, glossary.creation_time,
                    dumped))
            _loaded.put(_content_digest(dumped), glossary.dictionaries)

        await asyncio.to_thread(insert)
        return glossary

    async def save(self, glossary: Glossary) -> Glossary:
        """Store a changed name or dictionaries of an existing glossary."""

        def update() -> None:
            dumped = _dump(glossary.dictionaries)
            with self._lock:
                self._db.execute(
                    "UPDATE glossaries SET name = ?, dictionaries = ? WHERE glossary_id = ? "
                    "AND owner = ?", (glossary.name, dumped, glossary.glossary_id,
                                      stored_owner(glossary.owner)))
            _loaded.put(_content_digest(dumped), glossary.dictionaries)

        await asyncio.to_thread(update)
        return glossary

    async def get(self, glossary_id: str, owner: str = "") -> Glossary | None:
        def read() -> Glossary | None:
            with self._lock:
                row = self._db.execute(
                    "SELECT glossary_id, name, dictionaries, creation_time, owner FROM "
                    "glossaries WHERE glossary_id = ? AND owner = ?",
                    (glossary_id, stored_owner(owner))).fetchone()
            return None if row is None else _glossary(row, owner)

        return await asyncio.to_thread(read)

    async def list(self, owner: str = "") -> list[Glossary]:
        def read() -> list[Glossary]:
            with self._lock:
                rows = self._db.execute(
                    "SELECT glossary_id, name, dictionaries, creation_time, owner FROM "
                    "glossaries WHERE owner = ? ORDER BY creation_time",
                    (stored_owner(owner),)).fetchall()
            return [_glossary(row, owner) for row in rows]

        return await asyncio.to_thread(read)

    async def count(self, owner: str = "") -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM glossaries WHERE owner = ?",
                                    (stored_owner(owner),)).fetchone()[0]

    async def delete(self, glossary_id: str, owner: str = "") -> bool:
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM glossaries WHERE glossary_id = ? AND owner = ?",
                (glossary_id, stored_owner(owner)))
        return cursor.rowcount > 0

    async def close(self) -> None:
        with self._lock:
            self._db.close()


class SharedGlossaryStore:
    """Glossaries in the shared state store (``service.shared_state``), each a JSON value,
    with a set of ids per owner; what ``GlossaryStore`` does, for every replica. A store
    that does not answer raises StoreDown (the APIs answer 503).

    A value (``_record``) starts with a head: the digest of its entries' JSON, the id, the
    name, the creation time and the owner; the entries follow, as ``_dump`` writes them. A
    use reads the head alone (``_HEAD_BYTES``) and takes the entries this process holds by
    that digest (``_loaded``); only where it holds none does it read the whole value and
    parse them, so that a replica reads a 100,000-entry glossary (4 MB) once per content
    rather than on every request. A change writes the value again, with its new content's
    digest. The value is still the JSON object that versions without the head write and
    read (they skip the digest), so replicas of either read each other's glossaries while
    an upgrade rolls out; a value such a version wrote is read whole and written again in
    this layout."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    @staticmethod
    def _name(glossary_id: str) -> str:
        return f"{PREFIX}glossary:{glossary_id}"

    @staticmethod
    def _owned(owner: str) -> str:
        return f"{PREFIX}glossaries:{digest(owner)[:32]}"

    async def create(self, name: str, dictionaries: dict[Pair, dict[str, str]],
                     owner: str = "") -> Glossary:
        glossary = Glossary(str(uuid.uuid4()), name, dict(dictionaries),
                            datetime.now(UTC).isoformat(timespec="milliseconds")
                            .replace("+00:00", "Z"), owner)
        value, content = await asyncio.to_thread(_record, glossary)

        async def write(r: redis.asyncio.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(self._name(glossary.glossary_id), value)
                pipe.sadd(self._owned(owner), glossary.glossary_id)
                await pipe.execute()

        await self.store.run(write)
        _loaded.put(content, glossary.dictionaries)
        return glossary

    async def save(self, glossary: Glossary) -> Glossary:
        if await self.get(glossary.glossary_id, glossary.owner) is not None:
            value, content = await asyncio.to_thread(_record, glossary)
            await self.store.run(lambda r: r.set(self._name(glossary.glossary_id), value,
                                                 xx=True))
            _loaded.put(content, glossary.dictionaries)
        return glossary

    async def get(self, glossary_id: str, owner: str = "") -> Glossary | None:
        name = self._name(glossary_id)
        start = await self.store.command("GETRANGE", name, 0, _HEAD_BYTES - 1)
        if not start:
            return None
        head = _head(start)
        if head is not None:
            if head["owner"] != stored_owner(owner):
                return None
            dictionaries = _loaded.find(bytes.fromhex(head["digest"]))
            if dictionaries is not None:
                return _from_head(head, dictionaries, owner)
        value = await self.store.run(lambda r: r.get(name))
        if value is None:
            return None
        head, dictionaries, older = await asyncio.to_thread(_read, value)
        # A value written before owners were stored hashed holds its owner's key as it is.
        if head["owner"] not in (stored_owner(owner), owner if older else None):
            return None
        glossary = _from_head(head, dictionaries, owner)
        if older:  # written again in this layout, unless it was changed since it was read
            rewritten, content, read = await asyncio.to_thread(_rewritten, glossary, value)
            await self.store.script(_REWRITE, [name], [read, rewritten])
            _loaded.put(content, dictionaries)
        return glossary

    async def list(self, owner: str = "") -> list[Glossary]:
        ids = await self.store.run(lambda r: r.smembers(self._owned(owner)))
        found = await asyncio.gather(*(self.get(i.decode(), owner) for i in ids))
        return sorted((g for g in found if g is not None), key=lambda g: g.creation_time)

    async def count(self, owner: str = "") -> int:
        return int(await self.store.run(lambda r: r.scard(self._owned(owner))))

    async def delete(self, glossary_id: str, owner: str = "") -> bool:
        if await self.get(glossary_id, owner) is None:
            return False

        async def remove(r: redis.asyncio.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.delete(self._name(glossary_id))
                pipe.srem(self._owned(owner), glossary_id)
                await pipe.execute()

        await self.store.run(remove)
        return True

    async def close(self) -> None:
        pass


# The bytes of a stored value read on each use: its head (``_record``), about 250 bytes and
# its glossary's name. A head that does not fit (a name of thousands of characters) is
# found by reading the value whole, on each use.
_HEAD_BYTES = 4096
_HEAD_START = '{"digest": "'  # how a value with a head starts
# Where a value's head ends and its entries start: the head is JSON on one line (JSON
# escapes a line break inside a string), the entries start with one.
_ENTRIES_START = ', "dictionaries": [\n'
# A value of an older layout written again in this one, if it is still what was read (its
# SHA-1 the same): not over a change another replica made meanwhile.
_REWRITE = """
if redis.sha1hex(redis.call('GET', KEYS[1]) or '') == ARGV[1] then
  return redis.call('SET', KEYS[1], ARGV[2], 'XX')
end
return false
"""


def _record(glossary: Glossary) -> tuple[bytes, bytes]:
    """The value stored for ``glossary`` (encoded here, in the caller's thread, rather than
    by the client on the event loop), and the digest of its entries' content (the
    dictionaries' key in ``_loaded``)."""
    dumped = _dump(glossary.dictionaries)
    content = _content_digest(dumped)
    head = json.dumps({"digest": content.hex(), "glossary_id": glossary.glossary_id,
                       "name": glossary.name, "creation_time": glossary.creation_time,
                       "owner": stored_owner(glossary.owner)}, ensure_ascii=False)
    return f"{head[:-1]}{_ENTRIES_START[:-2]}{dumped}}}".encode(), content


def _rewritten(glossary: Glossary, value: bytes) -> tuple[bytes, bytes, str]:
    """``_record(glossary)``, and the SHA-1 of ``value``, what was read of it."""
    return *_record(glossary), hashlib.sha1(value).hexdigest()


def _head(start: bytes) -> dict | None:
    """The head of a value from its first ``_HEAD_BYTES``; None for a value without one, or
    whose head is longer."""
    text = start.decode("utf-8", errors="ignore")  # a character cut at the end dropped
    end = text.find(_ENTRIES_START)
    return json.loads(text[:end] + "}") if text.startswith(_HEAD_START) and end > 0 else None


def _read(value: bytes) -> tuple[dict, dict[Pair, dict[str, str]], bool]:
    """A whole value's head (or, of an older layout, its record), its dictionaries, and
    whether it is of an older layout (read in one json.loads, which holds the GIL for a
    fifth of a second for 100,000 entries: once, as it is then written again)."""
    text = value.decode()
    end = text.find(_ENTRIES_START)
    if text.startswith(_HEAD_START) and end > 0:
        dictionaries = _loaded.get(text[end + len(_ENTRIES_START) - 2:-1])
        return json.loads(text[:end] + "}"), dictionaries, False
    record = json.loads(text)
    return record, {(d["source_lang"], d["target_lang"]): d["entries"]
                    for d in record["dictionaries"]}, True


def _from_head(head: dict, dictionaries: dict[Pair, dict[str, str]], owner: str) -> Glossary:
    return Glossary(head["glossary_id"], head["name"], dictionaries, head["creation_time"],
                    owner)


# Entries per json.dumps or json.loads while a stored dictionary is written or read back
# (``_dump``, ``_load``): each call holds the GIL for a few ms, where one call for 100,000
# entries held it (and so the event loop, from its thread) for 0.21 s reading and 0.08 s
# writing (AMD EPYC, loaded).
_LOAD_LINES = 1000


def _dump(dictionaries: dict[Pair, dict[str, str]]) -> str:
    """The dictionaries as JSON, one entry a line: ``[{"source_lang": .., "target_lang": ..,
    "entries": {`` then ``"source": "target",`` a line, then ``}}``. JSON as any reader takes
    it, written and read back (``_load``) a little at a time, so that a thread doing it
    hands the GIL on every few milliseconds (one json.dumps of 100,000 entries held it 0.3 s).
    A term holds no line break (``_check_entry``), and JSON escapes any other control
    character, so each entry is one line."""
    lines = ["["]
    for number, ((source, target), entries) in enumerate(dictionaries.items()):
        head = json.dumps({"source_lang": source, "target_lang": target}, ensure_ascii=False)
        lines.append(("," if number else "") + head[:-1] + ', "entries": {')
        # _LOAD_LINES entries per json.dumps, an entry a line: a line break never occurs
        # inside a JSON string, so ",\n" separates entries and nothing else. Taken from the
        # entries as they go: a list of all 100,000 (source, target) tuples would be as many
        # objects for the garbage collector, whose full pass then held the GIL for 60 ms.
        items = iter(entries.items())
        chunks = []
        while part := dict(itertools.islice(items, _LOAD_LINES)):
            chunks.append(json.dumps(part, ensure_ascii=False, separators=(",\n", ": "))[1:-1])
        if chunks:
            lines.append(",\n".join(chunks))
        lines.append("}}")
    lines.append("]")
    return "\n".join(lines)


def _load(text: str) -> dict[Pair, dict[str, str]]:
    """Dictionaries as ``_dump`` writes them, ``_LOAD_LINES`` entries per json.loads; a row
    written otherwise (before this layout) in one json.loads."""
    lines = text.split("\n")
    if len(lines) < 3 or lines[0] != "[" or lines[-1] != "]":
        return {(d["source_lang"], d["target_lang"]): d["entries"] for d in json.loads(text)}
    dictionaries: dict[Pair, dict[str, str]] = {}
    at = 1
    while lines[at] != "]":
        head = json.loads(lines[at].lstrip(",").removesuffix(', "entries": {') + "}")
        end = lines.index("}}", at + 1)
        entries: dict[str, str] = {}
        for start in range(at + 1, end, _LOAD_LINES):
            chunk = "\n".join(lines[start:min(start + _LOAD_LINES, end)])
            entries.update(json.loads("{" + chunk.rstrip(",") + "}"))
        dictionaries[head["source_lang"], head["target_lang"]] = entries
        at = end + 1
    return dictionaries


class _Recent(Generic[K, V]):
    """At most ``size`` values by key, the least recently used dropped first. Not locked:
    its owner holds its own lock around each call."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self.size:
            self._values.popitem(last=False)


class _Loaded:
    """Dictionaries read from stored JSON, by the digest of the JSON (``_content_digest``),
    the least recently used dropped: a glossary used by every request is read from its row
    or value once per content, not once a request (100,000 entries: 0.3 s of CPU)."""

    def __init__(self, size: int) -> None:
        self._done: _Recent[bytes, dict[Pair, dict[str, str]]] = _Recent(size)
        self._lock = threading.Lock()

    def get(self, text: str) -> dict[Pair, dict[str, str]]:
        """The dictionaries ``text`` (``_dump``'s JSON) holds, read from it unless held."""
        key = _content_digest(text)
        found = self.find(key)
        if found is None:
            found = _load(text)
            self.put(key, found)
        return found

    def find(self, key: bytes) -> dict[Pair, dict[str, str]] | None:
        """The dictionaries of the JSON whose digest is ``key``, when held."""
        with self._lock:
            found = self._done.get(key)
        return None if found is None else dict(found)  # the mapping is the caller's to change

    def put(self, key: bytes, dictionaries: dict[Pair, dict[str, str]]) -> None:
        """Hold ``dictionaries``, whose JSON's digest is ``key`` (just written)."""
        with self._lock:
            self._done.put(key, dict(dictionaries))


def _content_digest(text: str) -> bytes:
    # hashlib hands the GIL on while it digests a large text.
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


_loaded = _Loaded(8)  # as many as compiled glossaries are kept (_CACHED_TERMS)


def _glossary(row: tuple, owner: str) -> Glossary:
    """The glossary of a stored row, owned by ``owner`` (whose key the row holds hashed)."""
    glossary_id, name, dictionaries, created, _ = row
    return Glossary(glossary_id, name, _loaded.get(dictionaries), created, owner)


def valid_id(glossary_id: str) -> bool:
    """Whether ``glossary_id`` has the form of an id this service hands out (a UUID)."""
    try:
        return str(uuid.UUID(glossary_id)) == glossary_id.lower()
    except ValueError:
        return False


class Terms:
    """A glossary's entries compiled for matching (``find``): one Aho-Corasick automaton
    (pyahocorasick) per layer, so that a text is scanned once whatever the glossary's size.
    Compiling 100,000 entries takes a fraction of a second and is done off the event loop
    and once per content (``compiled``); a sentence is then matched in microseconds.

    ``names``: the entries are place names (a bundle's, ``service.bundle.Bundle.terms``): they
    match as written only, and not inside a longer name ("Vienna Philharmonic", "Milan
    Kundera", "in Western Australia": beside a capitalised word that does not start the
    sentence, or after a qualifier such as "South" that does) nor as a possessive
    ("Munich's"), which the model inflects itself."""

    def __init__(self, entries: Mapping[str, str], *, names: bool = False) -> None:
        exact = {s: t for s, t in entries.items() if names or _case_matters(s)}
        folded = {_fold(s): t for s, t in entries.items() if not (names or _case_matters(s))}
        guards = _NAME_GUARD_PATTERNS if names else None
        self._layers = [_Layer(terms, fold, guards)
                        for terms, fold in ((exact, False), (folded, True)) if terms]

    def over(self, base: Terms) -> Terms:
        """These terms, then ``base``'s where none of these matches (a request's glossary
        over a bundle's place names)."""
        layered = Terms({})
        layered._layers = self._layers + base._layers
        return layered

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, target term) of every match in ``text``, in order, none overlapping:
        the longest entry wins where two could match at one place, an earlier layer's where
        two layers' could."""
        found: list[tuple[int, int, str]] = []
        taken: list[tuple[int, int]] = []  # sorted, none overlapping
        folded: str | None = None
        for layer in self._layers:
            if layer.fold and folded is None:
                folded = _fold(text)
            for start, end, target in layer.candidates(text, folded if layer.fold else text):
                at = bisect.bisect_left(taken, (start, start))
                if (at and taken[at - 1][1] > start) or (at < len(taken)
                                                         and taken[at][0] < end):
                    continue  # overlaps a longer or an earlier layer's match
                taken.insert(at, (start, end))
                found.append((start, end, target))
        return sorted(found)


class _Layer:
    """Automata whose keys are the source terms (case-folded when ``fold``), their values
    (length, target term). A match counts only as a whole word, and for place names only
    where ``guards`` (before, after) allow it.

    The terms are split among automata of ``_AUTOMATON_TERMS`` each: pyahocorasick builds
    an automaton holding the GIL, which for 100,000 terms at once stalls the event loop for
    seconds; a few thousand take a few milliseconds, and a text is scanned once per
    automaton, still in time linear in its length."""

    def __init__(self, terms: Mapping[str, str], fold: bool,
                 guards: tuple[regex.Pattern, regex.Pattern] | None) -> None:
        self.fold, self.guards = fold, guards
        self.automata: list[ahocorasick.Automaton] = []
        for number, (term, target) in enumerate(terms.items()):
            if number % _AUTOMATON_TERMS == 0:
                self._finish_last()
                self.automata.append(ahocorasick.Automaton())
            self.automata[-1].add_word(term, (len(term), target))
        self._finish_last()

    def _finish_last(self) -> None:
        if self.automata:
            self.automata[-1].make_automaton()

    def candidates(self, text: str, haystack: str) -> list[tuple[int, int, str]]:
        """Every whole-word match in ``haystack`` (``text`` as the keys are written), by
        start and the longest first."""
        matches = []
        for automaton in self.automata:
            for last, (length, target) in automaton.iter(haystack):
                start, end = last + 1 - length, last + 1
                if (start and _is_word(text[start - 1])) or (end < len(text)
                                                              and _is_word(text[end])):
                    continue
                if self.guards and not (self.guards[0].match(text, start)
                                        and self.guards[1].match(text, end)):
                    continue
                matches.append((start, -end, target))
        matches.sort()
        return [(start, -negative_end, target) for start, negative_end, target in matches]


def _is_word(character: str) -> bool:
    """What a regular expression's \\w matches: a letter, digit, mark or underscore."""
    return character.isalnum() or character == "_" or unicodedata.category(character)[0] == "M"


def _fold(text: str) -> str:
    """``text`` case-folded character by character, keeping its length, so that a match's
    offsets in the folded text are its offsets in ``text`` ("İ" and "ß", which fold to two
    characters, are lower-cased, or kept)."""
    folded = text.casefold()
    if len(folded) == len(text):
        return folded
    return "".join(_fold_character(c) for c in text)


def _fold_character(character: str) -> str:
    for candidate in (character.casefold(), character.lower()):
        if len(candidate) == 1:
            return candidate
    return character


# Glossaries up to this many entries compile on the event loop (well under a millisecond);
# larger ones in a thread, so that /health and every other request go on meanwhile.
_INLINE_ENTRIES = 256
# Terms per automaton (``_Layer``): building one of 4,096 holds the GIL for about 20 ms.
_AUTOMATON_TERMS = 4096
# Compiled glossaries kept, the least recently used dropped: 100,000 entries take about
# 30 MB compiled, so a handful of the largest allowed fits beside the models.
_CACHED_TERMS = 8


class _CompiledTerms:
    """Terms by the content of their entries, each compiled once: requests that bring the
    same glossary (stored or inline) while it compiles wait for that one compilation."""

    def __init__(self, size: int) -> None:
        self._done: _Recent[bytes, Terms] = _Recent(size)
        self._running: dict[bytes, concurrent.futures.Future[Terms]] = {}
        # The key of each mapping seen lately, by its identity (and held, so that the
        # identity stays its own): a stored glossary's entries are one cached mapping, used
        # again and again, and hashing 100,000 entries costs tens of milliseconds each time.
        self._keys: _Recent[int, tuple[Mapping[str, str], bytes]] = _Recent(size)
        self._lock = threading.Lock()

    async def get(self, entries: Mapping[str, str], stored: bool = False) -> Terms:
        if len(entries) <= _INLINE_ENTRIES:
            return self._compile(_content_key(entries), entries)
        with self._lock:
            seen = self._keys.get(id(entries)) if stored else None
        if seen is not None and seen[0] is entries:
            key = seen[1]
        else:
            key = await asyncio.to_thread(_content_key, entries)
            if stored:  # an inline glossary's mapping is the request's: not held
                with self._lock:
                    self._keys.put(id(entries), (entries, key))
        with self._lock:
            done = self._done.get(key)
            if done is not None:
                return done
            running = self._running.get(key)
            if running is None:
                running = self._running[key] = concurrent.futures.Future()
                # Running: a waiter that gives up (its client left) cannot cancel it for
                # the others.
                running.set_running_or_notify_cancel()
                # The loop's default pool: as many compile at once as it has threads.
                asyncio.get_running_loop().run_in_executor(None, self._finish, key, entries,
                                                           running)
        return await asyncio.wrap_future(running)

    def _finish(self, key: bytes, entries: Mapping[str, str],
                running: concurrent.futures.Future[Terms]) -> None:
        try:
            running.set_result(self._compile(key, entries))
        except Exception as exc:  # handed to every waiter
            running.set_exception(exc)
        finally:
            with self._lock:
                self._running.pop(key, None)

    def _compile(self, key: bytes, entries: Mapping[str, str]) -> Terms:
        with self._lock:
            done = self._done.get(key)
        if done is not None:
            return done
        terms = Terms(entries)
        with self._lock:
            self._done.put(key, terms)
        return terms


def _content_key(entries: Mapping[str, str]) -> bytes:
    """A digest of the entries as given: the same glossary, the same key. Entry by entry in
    Python, which hands the GIL on every few milliseconds (json.dumps of 100,000 entries
    would hold it for a quarter of a second)."""
    digest = hashlib.blake2b(digest_size=16)
    for source, target in entries.items():
        digest.update(f"{source}\t{target}\n".encode())
    return digest.digest()


_compiled_terms = _CompiledTerms(_CACHED_TERMS)


async def compiled(entries: Mapping[str, str], stored: bool = False) -> Terms:
    """``Terms(entries)``, compiled off the event loop when large, and once per content;
    ``stored``: the entries are a stored glossary's, a mapping its store hands out again,
    whose content is then hashed once."""
    return await _compiled_terms.get(entries, stored)


# Before and after a place name: no capitalised word but the sentence's first, no "'s". A
# qualifier that names another place ("South Australia", "New Mexico", "Upper Austria") is
# never a sentence's ordinary first word, so it counts wherever it stands.
_QUALIFIERS = ("North", "South", "East", "West", "Northern", "Southern", "Eastern", "Western",
               "Central", "New", "Upper", "Lower", "Greater", "Outer", "Inner")
_NAME_GUARD_PATTERNS = (
    regex.compile(r"(?<![\p{L}\d,;:]\s+\p{Lu}[\p{L}-]*\s+)"
                  r"(?<!\b(?:" + "|".join(_QUALIFIERS) + r")[\s-]+)", regex.V1),
    regex.compile(r"(?!\s+\p{Lu})(?!['’]s(?!\w))", regex.V1))


def _case_matters(term: str) -> bool:
    """Whether a source term matches only as written: capitals past its first letter
    ("US", "iPhone"), where "us" or "IPHONE" would be another word."""
    rest = term[1:]
    return not rest.islower() and any(c.isupper() for c in rest)


def has_word(text: str, term: str) -> bool:
    """Whether ``term`` stands in ``text`` as written, as a whole word (not "König" in
    "Königreich")."""
    return regex.search(r"(?<!\w)" + regex.escape(term) + r"(?!\w)", text) is not None
