"""An LRU of translated sentences, bounded by the memory its entries hold.

UI strings, menus and notifications come again and again; a sentence translated once is
answered from here. That is correct because a sentence's translation depends only on the
model, its pair, the decoding options and its source tokens, never on the sentences it was
batched with (the batch invariance ``service.batch`` guarantees and tests/test_decoding.py
checks), so a cached answer equals a computed one.

Keys (``sentence_key``) hold the model's fingerprint (``model_fingerprint``: manifest,
checksums included, and variant), the pair, every decoding option and the source, best as its
token ids (they are what the model sees; equal ids give equal translations whatever the
spelling). Values are stored as tuples and rebuilt as new ``Translation`` objects on every hit,
so no caller can change what another gets.

Memory is counted per entry as the ``sys.getsizeof`` of every object it holds (key and value
tuples, strings, numbers), each once, plus ``ENTRY_OVERHEAD``, the LRU's own bookkeeping per
entry: within 1% of what tracemalloc measures over 100,000 entries (bench/cache.py,
docs/sentence-cache.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

from service.metrics import Metrics
from service.search import Hypothesis, Translation
from service.shared_state import PREFIX, StateStore, StoreDown

CacheKey = tuple[Hashable, ...]
_Frozen = tuple[tuple[Any, ...], ...]  # one tuple of field values per hypothesis

# Per entry, the OrderedDict's slot and link node and the (value, size) pair: 144-151 bytes on
# CPython 3.11 by tracemalloc over 30,000 to 100,000 entries (bench/cache.py).
ENTRY_OVERHEAD = 152
_SMALL_INTS = range(-5, 257)  # CPython's shared int objects: held by no entry alone
_SHARED_KEY_PARTS = 3  # a key's model, source and target language


def model_fingerprint(manifest: Mapping[str, Any], variant: str) -> str:
    """A short digest naming a model's outputs: its manifest (which holds every file's
    sha256 and its decoding settings) and the variant served (fp32 and int8 differ). The
    device is left out: a process, and so its cache, serves one."""
    text = json.dumps(manifest, sort_keys=True, default=str) + "\0" + variant
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def sentence_key(model: str, pair: tuple[str, str], options: Any,
                 source: str | Sequence[int]) -> CacheKey:
    """The key of one sentence: ``model`` (``model_fingerprint``), the (source, target) pair,
    every field of ``options`` (a ``DecodeOptions``: beam size, length penalty, length caps,
    alternatives, n-gram ban) and ``source``, its token ids or normalised text."""
    if is_dataclass(options):
        values = tuple(getattr(options, f.name) for f in fields(options))
    else:
        values = tuple(options)
    source_key = source if isinstance(source, str) else tuple(source)
    return (model, *pair, values, source_key)


def _freeze(translation: Translation) -> _Frozen:
    return tuple(
        tuple(tuple(value) if isinstance(value, list) else value
              for value in (getattr(hypothesis, f.name) for f in fields(hypothesis)))
        for hypothesis in translation.hypotheses
    )


def _thaw(frozen: _Frozen) -> Translation:
    return Translation([
        Hypothesis(*(list(value) if isinstance(value, tuple) else value for value in values))
        for values in frozen
    ])


def held_bytes(value: object, seen: set[int] | None = None) -> int:
    """Bytes of ``value`` and everything it holds, for the tuples, strings and numbers keys
    and frozen translations are made of, each object once (alternatives share their common
    prefix's ids; ``seen`` holds the ids of those counted already). CPython's shared small
    ints and one-character strings count nothing."""
    if seen is None:
        seen = set()
    if id(value) in seen or value is None or isinstance(value, bool):
        return 0
    if type(value) is int and value in _SMALL_INTS:
        return 0
    if type(value) is str and len(value) == 1 and ord(value) < 256:
        return 0
    seen.add(id(value))
    if isinstance(value, tuple):
        return sys.getsizeof(value) + sum(held_bytes(item, seen) for item in value)
    return sys.getsizeof(value)


def entry_bytes(key: CacheKey, frozen: _Frozen) -> int:
    """The memory one entry holds. The model and pair strings are the bundle's, shared by every
    key: only the key's slots for them count."""
    seen: set[int] = set()
    return (sys.getsizeof(key) + sum(held_bytes(part, seen) for part in key[_SHARED_KEY_PARTS:])
            + held_bytes(frozen, seen) + ENTRY_OVERHEAD)


class SentenceCache:
    """Translated sentences, least recently used evicted first, within ``max_bytes``
    (0 disables it: every ``get`` misses and ``put`` keeps nothing). Safe to share between
    the scheduler's worker threads and the event loop."""

    def __init__(self, max_bytes: int, metrics: Metrics | None = None):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, tuple[_Frozen, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._metrics = metrics
        if metrics is not None:
            metrics.sentence_cache_bytes.set_function(lambda: self.bytes)
            metrics.sentence_cache_entries.set_function(lambda: len(self._entries))

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> Translation | None:
        """The cached translation of ``key`` (a new object each call), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
            else:
                self._entries.move_to_end(key)
                self.hits += 1
        if self._metrics is not None:
            (self._metrics.sentence_cache_misses if entry is None
             else self._metrics.sentence_cache_hits).inc()
        return None if entry is None else _thaw(entry[0])

    def put(self, key: CacheKey, translation: Translation) -> None:
        """Keep ``translation`` for ``key`` (a copy: later changes to it are not seen),
        evicting the least recently used entries to stay within the budget; an entry larger
        than the whole budget is not kept."""
        if not self.enabled:
            return
        frozen = _freeze(translation)
        size = entry_bytes(key, frozen)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._entries[key] = (frozen, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0


# Keep ``pairs`` (name, value, name, value, ...) for ARGV[2] seconds, and at most ARGV[1]
# names in the index (KEYS[1], a sorted set by time of writing): the oldest past that, and
# names whose time is up, are dropped from both.
_PUT = """
local now = tonumber(redis.call('TIME')[1])
local most, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
for i = 3, #ARGV, 2 do
  redis.call('SET', ARGV[i], ARGV[i + 1], 'EX', ttl)
  redis.call('ZADD', KEYS[1], now, ARGV[i])
end
local over = redis.call('ZCARD', KEYS[1]) - most
while over > 0 do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, math.min(over, 1000) - 1)
  redis.call('DEL', unpack(oldest))
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #oldest - 1)
  over = over - #oldest
end
return 0
"""
_MAX_SHARED_VALUE = 64 * 1024  # bytes; a longer translation is kept by the process only


class SharedTier:
    """The cache tier replicas share through the state store, behind each process's own
    ``SentenceCache``: a sentence translated on one replica is a hit on the others. Names hold
    the model's fingerprint, so a new model never gets an old model's translations; entries
    expire after ``ttl_s`` and at most ``max_entries`` are kept (the oldest go first). A batch
    is looked up in one round trip; what the requests of ``WRITE_AFTER_S`` decoded is written
    in one, after their answers. A store that does not answer is a miss, and nothing is
    written."""

    WRITE_AFTER_S = 0.02
    _MAX_PENDING = 10_000  # entries waiting to be written; past it new ones are not kept

    def __init__(self, store: StateStore, max_entries: int, ttl_s: float,
                 metrics: Metrics | None = None) -> None:
        self.store = store
        self.max_entries = max_entries
        self.ttl_s = max(1, int(ttl_s))
        self._metrics = metrics
        self._pending: list[str] = []  # name, value, name, value, ...
        self._writing: asyncio.Task[None] | None = None

    @staticmethod
    def name(key: CacheKey) -> str:
        rest = json.dumps(key[1:], default=str, separators=(",", ":"))
        return f"{PREFIX}cache:{key[0]}:{hashlib.sha256(rest.encode()).hexdigest()[:40]}"

    async def get_many(self, keys: Sequence[CacheKey]) -> list[Translation | None]:
        names = [self.name(key) for key in keys]
        try:
            values = await self.store.command("MGET", *names)
        except StoreDown:
            return [None] * len(keys)
        found = [None if value is None else _thaw(json.loads(value)) for value in values]
        if self._metrics is not None:
            hits = sum(value is not None for value in found)
            self._metrics.shared_cache_hits.inc(hits)
            self._metrics.shared_cache_misses.inc(len(found) - hits)
        return found

    def put_many(self, items: Sequence[tuple[CacheKey, Translation]]) -> None:
        """Keep ``items`` in the shared tier soon (with what other requests decode
        meanwhile); returns at once."""
        if len(self._pending) >= 2 * self._MAX_PENDING:
            return
        for key, translation in items:
            value = json.dumps(_freeze(translation), separators=(",", ":"))
            if len(value) <= _MAX_SHARED_VALUE:
                self._pending += [self.name(key), value]
        if self._pending and self._writing is None:
            self._writing = asyncio.get_running_loop().create_task(self._write_soon())

    async def _write_soon(self) -> None:
        try:
            await asyncio.sleep(self.WRITE_AFTER_S)
            pending, self._pending = self._pending, []
            for start in range(0, len(pending), 2000):  # 1,000 entries a call at most
                with contextlib.suppress(StoreDown):
                    await self.store.script(_PUT, [f"{PREFIX}cache-index"], [
                        self.max_entries, self.ttl_s, *pending[start:start + 2000]])
        finally:
            self._writing = None
