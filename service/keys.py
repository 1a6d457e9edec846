"""API keys: those of API_KEYS, and those managed at run time with ``translate-keys``, each
with its own limits if given.

Managed keys live where the service's state does (``service.shared_state``): in Redis when
STATE_URL is set, so every replica sees a change, else in a SQLite file under DATA_DIR. Only
a key's SHA-256 is stored, so the table, a backup of it or a Redis dump gives no key away;
``translate-keys add`` prints the key once. Each process reads the table every
KEYS_REFRESH_S and checks keys against its copy, so a request costs no round trip, a change
applies within that long, and a store that is down leaves the last table read in force.

    translate-keys add NAME [--requests-per-minute N] [--chars-per-minute N]
    translate-keys remove NAME
    translate-keys list
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import secrets
import sqlite3
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from service.ratelimit import Caps
from service.settings import Settings
from service.shared_state import PREFIX, StateStore, StoreDown, digest

log = logging.getLogger("service")
_TABLE = f"{PREFIX}keys"  # a Redis hash: the key's SHA-256 -> its record as JSON


@dataclass(frozen=True)
class ApiKey:
    """A managed key's record; 0 limits mean the service's (REQUESTS_PER_MINUTE,
    CHARS_PER_MINUTE)."""

    name: str
    requests_per_minute: int = 0
    chars_per_minute: int = 0
    created: str = ""

    def caps(self, default: Caps) -> Caps:
        return Caps(self.requests_per_minute or default.requests_per_minute,
                    self.chars_per_minute or default.chars_per_minute)


class KeyBookError(ValueError):
    """A key that cannot be added or removed (a name taken, a name unknown)."""


class SqliteKeys:
    """Managed keys in a SQLite file (one process's, or one container's). The service only
    reads it, and only once ``translate-keys`` has made it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _open(self, create: bool) -> sqlite3.Connection | None:
        if self._db is None and (create or self.path.exists()):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS keys (digest TEXT PRIMARY KEY, "
                       "name TEXT UNIQUE NOT NULL, record TEXT NOT NULL)")
            self._db = db
        return self._db

    async def load(self) -> dict[str, ApiKey]:
        with self._lock:
            db = self._open(create=False)
            rows = db.execute("SELECT digest, record FROM keys").fetchall() if db else []
        return {row[0]: ApiKey(**json.loads(row[1])) for row in rows}

    async def add(self, key_digest: str, record: ApiKey) -> None:
        try:
            with self._lock:
                db = self._open(create=True)
                assert db is not None
                db.execute("INSERT INTO keys VALUES (?, ?, ?)",
                           (key_digest, record.name, json.dumps(asdict(record))))
        except sqlite3.IntegrityError:
            raise KeyBookError(f"a key named {record.name!r} exists") from None

    async def remove(self, name: str) -> None:
        with self._lock:
            db = self._open(create=False)
            removed = db.execute("DELETE FROM keys WHERE name = ?", (name,)).rowcount if db else 0
        if not removed:
            raise KeyBookError(f"no key named {name!r}")

    async def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class RedisKeys:
    """Managed keys in the shared store: every replica reads the same table."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    async def load(self) -> dict[str, ApiKey]:
        table = await self.store.run(lambda r: r.hgetall(_TABLE))
        return {name.decode(): ApiKey(**json.loads(value)) for name, value in table.items()}

    async def add(self, key_digest: str, record: ApiKey) -> None:
        if any(known.name == record.name for known in (await self.load()).values()):
            raise KeyBookError(f"a key named {record.name!r} exists")
        await self.store.run(lambda r: r.hset(_TABLE, key_digest, json.dumps(asdict(record))))

    async def remove(self, name: str) -> None:
        found = [found for found, known in (await self.load()).items() if known.name == name]
        if not found:
            raise KeyBookError(f"no key named {name!r}")
        await self.store.run(lambda r: r.hdel(_TABLE, *found))

    async def close(self) -> None:
        pass


KeyBook = SqliteKeys | RedisKeys


def key_book(settings: Settings, store: StateStore | None) -> KeyBook:
    """Where the managed keys are: the shared store, else DATA_DIR/keys.sqlite3."""
    return RedisKeys(store) if store is not None else SqliteKeys(settings.data_dir /
                                                                  "keys.sqlite3")


class Keys:
    """The keys a request may show: API_KEYS's and the managed ones last read."""

    def __init__(self, settings: Settings, book: KeyBook | None) -> None:
        self._static = [key.encode() for key in settings.api_keys]
        self._require = settings.require_keys
        self._book = book
        self._managed: dict[str, ApiKey] = {}
        self.refresh_s = settings.keys_refresh_s

    @property
    def required(self) -> bool:
        """Whether requests must show a key."""
        return bool(self._static or self._managed or self._require)

    def find(self, key: str) -> ApiKey | None:
        """The key's record (API_KEYS's: a record without limits of its own), or None. Every
        static key is compared in constant time; managed keys are found by their digest."""
        given = key.encode()
        if any([hmac.compare_digest(given, known) for known in self._static]):
            return ApiKey("API_KEYS")
        return self._managed.get(digest(key)) if key else None

    async def refresh(self) -> None:
        """Read the managed keys again; a store that does not answer, or a file that cannot
        be read, leaves the last table read."""
        if self._book is None:
            return
        try:
            self._managed = await self._book.load()
        except StoreDown:
            pass
        except (sqlite3.Error, OSError, ValueError, TypeError) as exc:
            log.warning("keys: the managed keys cannot be read: %s", exc)

    async def keep_fresh(self) -> None:
        """``refresh`` every KEYS_REFRESH_S, until cancelled."""
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()


async def _command(args: argparse.Namespace, settings: Settings) -> int:
    store = StateStore(settings.state_url, timeout_s=2.0) if settings.state_url else None
    book = key_book(settings, store)
    try:
        if args.command == "add":
            key = args.key or secrets.token_urlsafe(24)
            created = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            await book.add(digest(key), ApiKey(args.name, args.requests_per_minute,
                                               args.chars_per_minute, created))
            print(key)
        elif args.command == "remove":
            await book.remove(args.name)
        else:
            for record in sorted((await book.load()).values(), key=lambda k: k.name):
                limits = (f"{record.requests_per_minute or 'default'} requests/min, "
                          f"{record.chars_per_minute or 'default'} characters/min")
                print(f"{record.name}\t{limits}\tcreated {record.created}")
    except KeyBookError as exc:
        print(f"translate-keys: {exc}", file=sys.stderr)
        return 1
    except StoreDown:
        print("translate-keys: STATE_URL does not answer", file=sys.stderr)
        return 1
    finally:
        await book.close()
        if store is not None:
            await store.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``translate-keys``: add, remove or list the API keys managed at run time, where the
    service reads them (STATE_URL, else DATA_DIR; both from the environment or flags)."""
    parser = argparse.ArgumentParser(prog="translate-keys", description=main.__doc__)
    parser.add_argument("--state-url", help="overrides STATE_URL")
    parser.add_argument("--data-dir", type=Path, help="overrides DATA_DIR")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="add a key and print it (once)")
    add.add_argument("name", help="a name for the key (who holds it)")
    add.add_argument("--requests-per-minute", type=int, default=0,
                     help="this key's limit (default: the service's REQUESTS_PER_MINUTE)")
    add.add_argument("--chars-per-minute", type=int, default=0,
                     help="this key's limit (default: the service's CHARS_PER_MINUTE)")
    add.add_argument("--key", help="the key itself (default: 32 random characters)")
    commands.add_parser("remove", help="remove the key of this name").add_argument("name")
    commands.add_parser("list", help="the keys' names and limits (never the keys)")
    args = parser.parse_args(argv)
    if args.command == "add" and min(args.requests_per_minute, args.chars_per_minute) < 0:
        parser.error("limits are >= 0 (0: the service's)")
    overrides = {name: value for name, value in (("state_url", args.state_url),
                                                  ("data_dir", args.data_dir)) if value}
    return asyncio.run(_command(args, Settings(**overrides)))


if __name__ == "__main__":
    sys.exit(main())
