"""The state replicas share, in Redis (or Valkey) when STATE_URL names one.

Without STATE_URL each process keeps its own: rate limits, usage and the sentence cache in
memory, API keys added at run time and glossaries in SQLite files under DATA_DIR, documents in
memory. With it, every replica reads and writes the same: rate limits (a script on the server,
so a client's allowance is exact across replicas), usage, a shared tier of the sentence cache
behind each process's own, API keys with their limits, glossaries, and document jobs with their
files. ``service.ratelimit``, ``service.sentence_cache``, ``service.keys``,
``service.glossary`` and ``service.documents`` each hold their part; this module holds the
connection.

Faults. Every call has a deadline (STATE_TIMEOUT_S); a call that fails marks the store down,
and for a back-off (0.5 s, doubling to 8 s) calls fail at once rather than each waiting out the
deadline. Callers fall back where they can (limits and cache to the process's own tier, usage
counted locally and added once the store is back, keys to the last table read) and answer 503
with Retry-After where they cannot (a glossary, a document stored by another replica). The
gauge ``translate_state_store_up`` and a warning say when it is down, and a line when it is
back.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from service.metrics import Metrics

if TYPE_CHECKING:
    import redis.asyncio

log = logging.getLogger("service")
T = TypeVar("T")
PREFIX = "nmt:"  # every key this service writes, so one Redis can hold other things too
_FIRST_BACKOFF_S, _MAX_BACKOFF_S = 0.5, 8.0


def digest(secret: str) -> str:
    """What the store keeps of a secret (an API key, a document key, a glossary's owner): its
    SHA-256, so that neither the store nor a dump of it gives one away."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def stored_owner(owner: str) -> str:
    """What a store keeps of a glossary's or document's owner, an API key: its digest, marked
    as one ("" where the service has no keys)."""
    return f"sha256:{digest(owner)}" if owner else ""


class StoreDown(Exception):
    """The state store did not answer (down, slow, or within its back-off)."""

    def __init__(self, retry_after: float = 1.0) -> None:
        super().__init__("the shared state store (STATE_URL) is unavailable")
        self.retry_after = max(1, round(retry_after))


class StateStore:
    """One Redis connection pool, its deadline and its back-off. ``command`` and ``script``
    send what concurrent requests ask in the same turn of the event loop as one pipeline: a
    round trip costs the loop about 70 us of CPU alone and 16 us a command in a pipeline of
    20 (redis-py 8, loopback), and the requests of a loaded server ask together."""

    def __init__(self, url: str, timeout_s: float = 0.25, metrics: Metrics | None = None,
                 ) -> None:
        # Imported here: a service without STATE_URL never needs the client (6 MiB imported).
        import redis.asyncio
        import redis.exceptions
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._errors = redis.exceptions
        # No retries inside the client: a retry would multiply the deadline callers wait.
        self.redis = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), health_check_interval=30)
        self.timeout_s = timeout_s
        self.up = True
        self._down_until = 0.0
        self._backoff = _FIRST_BACKOFF_S
        self._metrics = metrics
        if metrics is not None:
            metrics.state_store_up.set(1)
        self._queued: list[tuple[tuple[Any, ...], str | None, asyncio.Future[Any]]] = []

    async def command(self, *command: Any) -> Any:
        """One Redis command's reply, sent with the others of this turn; StoreDown."""
        return await self._queue(command, None)

    async def script(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """A Lua script's reply (by its digest, loaded on the server when it lacks it), sent
        with the others of this turn; StoreDown."""
        digest = hashlib.sha1(source.encode()).hexdigest()
        return await self._queue(("EVALSHA", digest, len(keys), *keys, *args), source)

    def _queue(self, command: tuple[Any, ...], source: str | None) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self._queued.append((command, source, future))
        if len(self._queued) == 1:
            asyncio.get_running_loop().call_soon(self._send_queued)
        return future

    def _send_queued(self) -> None:
        queued, self._queued = self._queued, []
        task = asyncio.get_running_loop().create_task(self._send(queued))
        task.add_done_callback(lambda done: done.exception() if not done.cancelled() else None)

    async def _send(self, queued: list[tuple[tuple[Any, ...], str | None, asyncio.Future[Any]]],
                    ) -> None:
        async def send(r: redis.asyncio.Redis) -> list[Any]:
            async with r.pipeline(transaction=False) as pipe:
                for command, _, _ in queued:
                    pipe.execute_command(*command)
                return await pipe.execute(raise_on_error=False)

        try:
            replies = await self.run(send)
        except Exception as exc:  # StoreDown, or anything else: no caller is left waiting
            for _, _, future in queued:
                if not future.done():
                    future.set_exception(StoreDown(exc.retry_after) if isinstance(
                        exc, StoreDown) else exc)
            return
        for (command, source, future), reply in zip(queued, replies, strict=True):
            if future.done():
                continue
            if (source is not None and isinstance(reply, self._errors.NoScriptError)):
                try:  # a restarted Redis has no scripts: EVAL loads it with the call
                    reply = await self.run(lambda r, c=command, s=source: r.execute_command(
                        "EVAL", s, *c[2:]))
                except StoreDown as exc:
                    future.set_exception(exc)
                    continue
            if isinstance(reply, Exception):
                future.set_exception(StoreDown())
            else:
                future.set_result(reply)

    async def run(self, call: Callable[[redis.asyncio.Redis], Awaitable[T]]) -> T:
        """``call(redis)``'s result, or StoreDown."""
        now = time.monotonic()
        if not self.up and now < self._down_until:
            raise StoreDown(self._down_until - now)
        try:
            # The socket timeout bounds each read; this bounds the whole call (a pipeline).
            result = await asyncio.wait_for(call(self.redis), self.timeout_s * 4)
        except (TimeoutError, self._errors.RedisError, OSError) as exc:
            self._failed(exc)
            raise StoreDown(self._backoff) from exc
        if not self.up:
            log.warning("state store: back (STATE_URL answers again)")
            self.up, self._backoff = True, _FIRST_BACKOFF_S
            if self._metrics is not None:
                self._metrics.state_store_up.set(1)
        return result

    def _failed(self, exc: BaseException) -> None:
        if self._metrics is not None:
            self._metrics.state_store_errors.inc()
        if self.up:
            log.warning("state store: unavailable (%s: %s); limits and cache fall back to "
                        "this process", type(exc).__name__, exc)
            self.up = False
            if self._metrics is not None:
                self._metrics.state_store_up.set(0)
        else:
            self._backoff = min(_MAX_BACKOFF_S, self._backoff * 2)
        self._down_until = time.monotonic() + self._backoff

    async def close(self) -> None:
        await self.redis.aclose()
