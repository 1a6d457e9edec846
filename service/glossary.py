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

import csv
import io
import json
import sqlite3
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import redis.asyncio
import regex

from service.shared_state import PREFIX, StateStore, digest, stored_owner

FORMATS = ("tsv", "csv")
SCHEMA_VERSION = 2  # the glossaries table's layout (PRAGMA user_version)


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
                  max_term_chars: int = 1024) -> dict[str, str]:
    """{source: target} of TSV (a tab between the terms) or CSV (a comma; quoted fields as
    the csv module reads them; further columns, DeepL's optional language codes, ignored)."""
    if entries_format not in FORMATS:
        raise GlossaryError(f"Unsupported entries_format '{entries_format}': tsv or csv.")
    if entries_format == "tsv":
        rows = [line.split("\t") for line in text.splitlines() if line.strip()]
    else:
        rows = [row for row in csv.reader(io.StringIO(text)) if any(f.strip() for f in row)]
    entries: dict[str, str] = {}
    for number, row in enumerate(rows, start=1):
        if len(row) < 2 or (entries_format == "tsv" and len(row) != 2):
            raise GlossaryError(f"Entry {number} is not a source and a target term.")
        source, target = row[0], row[1]
        for term in (source, target):
            if not term or term != term.strip() or any(c in term for c in "\t\r\n"):
                raise GlossaryError(f"Entry {number} has an empty term, or one with a tab, a "
                                    "line break or surrounding spaces.")
            if len(term) > max_term_chars:
                raise GlossaryError(f"Entry {number} has a term over {max_term_chars} "
                                    "characters.")
        if source in entries:
            raise GlossaryError(f"Entry {number} repeats the source term '{source}'.")
        entries[source] = target
    if not entries:
        raise GlossaryError("The glossary has no entries.")
    if max_entries and len(entries) > max_entries:
        raise GlossaryError(f"{len(entries)} entries; at most {max_entries} "
                            "(MAX_GLOSSARY_ENTRIES).")
    return entries


class GlossaryStore:
    """Glossaries in a SQLite file (``":memory:"``: in the process only), one row each, its
    dictionaries as JSON. Calls are short (one indexed row); a lock serialises them across
    the threads that may call."""

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
        with self._lock:
            self._db.execute("INSERT INTO glossaries VALUES (?, ?, ?, ?, ?)", (
                glossary.glossary_id, stored_owner(owner), name, glossary.creation_time,
                _dump(glossary.dictionaries)))
        return glossary

    async def save(self, glossary: Glossary) -> Glossary:
        """Store a changed name or dictionaries of an existing glossary."""
        with self._lock:
            self._db.execute(
                "UPDATE glossaries SET name = ?, dictionaries = ? WHERE glossary_id = ? AND "
                "owner = ?", (glossary.name, _dump(glossary.dictionaries),
                              glossary.glossary_id, stored_owner(glossary.owner)))
        return glossary

    async def get(self, glossary_id: str, owner: str = "") -> Glossary | None:
        with self._lock:
            row = self._db.execute(
                "SELECT glossary_id, name, dictionaries, creation_time, owner FROM glossaries "
                "WHERE glossary_id = ? AND owner = ?",
                (glossary_id, stored_owner(owner))).fetchone()
        return None if row is None else _glossary(row, owner)

    async def list(self, owner: str = "") -> list[Glossary]:
        with self._lock:
            rows = self._db.execute(
                "SELECT glossary_id, name, dictionaries, creation_time, owner FROM glossaries "
                "WHERE owner = ? ORDER BY creation_time", (stored_owner(owner),)).fetchall()
        return [_glossary(row, owner) for row in rows]

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
    that does not answer raises StoreDown (the APIs answer 503)."""

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
        value = _record(glossary)

        async def write(r: redis.asyncio.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(self._name(glossary.glossary_id), value)
                pipe.sadd(self._owned(owner), glossary.glossary_id)
                await pipe.execute()

        await self.store.run(write)
        return glossary

    async def save(self, glossary: Glossary) -> Glossary:
        if await self.get(glossary.glossary_id, glossary.owner) is not None:
            await self.store.run(lambda r: r.set(self._name(glossary.glossary_id),
                                                 _record(glossary), xx=True))
        return glossary

    async def get(self, glossary_id: str, owner: str = "") -> Glossary | None:
        value = await self.store.run(lambda r: r.get(self._name(glossary_id)))
        record = None if value is None else json.loads(value)
        glossary = None if record is None else _from_record(record, owner)
        if glossary is not None and record["owner"] == owner != "":
            # Written before owners were stored hashed: write it again without the key.
            await self.store.run(lambda r: r.set(self._name(glossary_id), _record(glossary),
                                                 xx=True))
        return glossary

    async def list(self, owner: str = "") -> list[Glossary]:
        ids = sorted(await self.store.run(lambda r: r.smembers(self._owned(owner))))
        if not ids:
            return []
        values = await self.store.run(lambda r: r.mget([self._name(i.decode()) for i in ids]))
        found = [_from_record(json.loads(value), owner) for value in values if value is not None]
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


def _record(glossary: Glossary) -> str:
    return json.dumps({"glossary_id": glossary.glossary_id, "name": glossary.name,
                       "dictionaries": json.loads(_dump(glossary.dictionaries)),
                       "creation_time": glossary.creation_time,
                       "owner": stored_owner(glossary.owner)}, ensure_ascii=False)


def _from_record(record: dict, owner: str) -> Glossary | None:
    """The glossary of a stored ``record``, when ``owner`` owns it (stored hashed, or as
    written before owners were)."""
    if record["owner"] not in (stored_owner(owner), owner):
        return None
    return _glossary((record["glossary_id"], record["name"], json.dumps(record["dictionaries"]),
                      record["creation_time"], record["owner"]), owner)


def _dump(dictionaries: dict[Pair, dict[str, str]]) -> str:
    return json.dumps([{"source_lang": s, "target_lang": t, "entries": entries}
                       for (s, t), entries in dictionaries.items()], ensure_ascii=False)


def _glossary(row: tuple, owner: str) -> Glossary:
    """The glossary of a stored row, owned by ``owner`` (whose key the row holds hashed)."""
    glossary_id, name, dictionaries, created, _ = row
    return Glossary(glossary_id, name, {(d["source_lang"], d["target_lang"]): d["entries"]
                                        for d in json.loads(dictionaries)}, created, owner)


def valid_id(glossary_id: str) -> bool:
    """Whether ``glossary_id`` has the form of an id this service hands out (a UUID)."""
    try:
        return str(uuid.UUID(glossary_id)) == glossary_id.lower()
    except ValueError:
        return False


class Terms:
    """A glossary's entries compiled for matching (``find``). Built once per request.

    ``names``: the entries are place names (a bundle's, ``service.bundle.Bundle.terms``): they
    match as written only, and not inside a longer name ("Vienna Philharmonic", "Milan
    Kundera", "in Western Australia": beside a capitalised word that does not start the
    sentence, or after a qualifier such as "South" that does) nor as a possessive
    ("Munich's"), which the model inflects itself."""

    def __init__(self, entries: Mapping[str, str], *, names: bool = False) -> None:
        exact = {s: t for s, t in entries.items() if names or _case_matters(s)}
        folded = {s.casefold(): t for s, t in entries.items() if not (names or _case_matters(s))}
        before, after = _NAME_GUARDS if names else ("", "")
        self._layers = [(regex.compile(before + _alternation(terms) + after, flags), lookup)
                        for terms, flags, lookup in (
                            (exact, regex.V1, exact.get),
                            (folded, regex.V1 | regex.IGNORECASE,
                             lambda term: folded.get(term.casefold())))
                        if terms]

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
        taken: list[tuple[int, int]] = []
        for pattern, lookup in self._layers:
            for match in pattern.finditer(text):
                start, end = match.span()
                if any(start < b and a < end for a, b in taken):
                    continue
                target = lookup(match.group())
                if target is not None:
                    found.append((start, end, target))
                    taken.append((start, end))
        return sorted(found)


# Before and after a place name: no capitalised word but the sentence's first, no "'s". A
# qualifier that names another place ("South Australia", "New Mexico", "Upper Austria") is
# never a sentence's ordinary first word, so it counts wherever it stands.
_QUALIFIERS = ("North", "South", "East", "West", "Northern", "Southern", "Eastern", "Western",
               "Central", "New", "Upper", "Lower", "Greater", "Outer", "Inner")
_NAME_GUARDS = (r"(?<![\p{L}\d,;:]\s+\p{Lu}[\p{L}-]*\s+)"
                r"(?<!\b(?:" + "|".join(_QUALIFIERS) + r")[\s-]+)",
                r"(?!\s+\p{Lu})(?!['’]s(?!\w))")


def _case_matters(term: str) -> bool:
    """Whether a source term matches only as written: capitals past its first letter
    ("US", "iPhone"), where "us" or "IPHONE" would be another word."""
    return any(c.isupper() for c in term[1:])


def _alternation(terms: Mapping[str, str]) -> str:
    """Whole words: not preceded or followed by a letter, digit or underscore. Longest first,
    so that "New York City" wins over "New York"."""
    ordered = sorted(terms, key=len, reverse=True)
    return r"(?<![\w])(?:" + "|".join(regex.escape(term) for term in ordered) + r")(?![\w])"


def has_word(text: str, term: str) -> bool:
    """Whether ``term`` stands in ``text`` as written, as a whole word (not "König" in
    "Königreich")."""
    return regex.search(r"(?<!\w)" + regex.escape(term) + r"(?!\w)", text) is not None
