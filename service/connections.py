"""Connection hygiene: deadlines for a request's headers and body, a cap on open connections,
and an open-file limit that fits the cap.

uvicorn closes idle kept-alive connections (``timeout_keep_alive``) but waits for request
headers and bodies as long as a client cares to send them, and it accepts connections until the
process runs out of file descriptors, after which nobody gets in. ``GuardedHttpProtocol`` adds
the header deadline and the cap to uvicorn's own HTTP protocol; ``BodyDeadlineMiddleware`` bounds
the body read, where the app reads it. No proxy is needed in front, so the service is safe
however it is deployed; a proxy can still add per-client limits the service cannot see.

At shutdown no request that reached the server goes unanswered: from the stop signal on
``CloseWhenStoppingMiddleware`` ends kept-alive connections with their responses, a connection
that is new or receiving a request when the listener closes answers that request before
closing, and the connections the kernel has completed but the event loop not yet accepted are
accepted as the listener closes (``close_listeners``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import resource
import socket
import sys
import termios
from collections.abc import Callable, Sequence
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.errors import ApiError, error_body
from service.metrics import ASGIApp, Message, Metrics, Receive, Scope, Send

log = logging.getLogger(__name__)

# Descriptors the process needs besides client connections: the listener, the event loop's,
# log streams, the model files while they load, onnxruntime's and Python's own. A running
# server holds 18 (the default bundle loaded, two workers: ls /proc/PID/fd).
RESERVED_FILES = 64
# At the cap, a connection opened or answered this long ago, with nothing unread, may be closed
# for a newcomer: 48 clients connecting at once to a cap of 40 lost 8 requests when a
# connection opened milliseconds before, its request not yet written, could be closed.
EVICT_IDLE_S = 1.0
# How long a refused connection is read and dropped before it is closed, and how many may be
# at once (the rest are closed at once).
LINGER_S = 2.0
LINGER_MAX = RESERVED_FILES // 2
# Answered while the event loop is behind: liveness, readiness and metrics must reach the
# orchestrator and the monitoring during a flood, or it would restart a server that works.
PROBE_PATHS = frozenset({b"/health", b"/ready", b"/metrics", b"/libretranslate/health"})


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration with the limits its HTTP protocol lacks."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout_s: float,
        max_connections: int,
        metrics: Metrics,
        trusted_proxies: Sequence[str] = (),
        loop_lag: Callable[[], float] = lambda: 0.0,
        max_loop_lag_s: float = float("inf"),
        **kwargs: Any,
    ) -> None:
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise (and from
        # FORWARDED_ALLOW_IPS): any local process could then pose as any address and escape
        # the limits counted per address. Only TRUSTED_PROXIES are believed.
        super().__init__(app, http=GuardedHttpProtocol, proxy_headers=bool(trusted_proxies),
                         forwarded_allow_ips=list(trusted_proxies), **kwargs)
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.metrics = metrics
        self.loop_lag = loop_lag
        self.max_loop_lag_s = max_loop_lag_s


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a cap on connections.

    A connection that has not sent complete headers within ``header_timeout_s`` of opening (or
    of the first byte of its next request) gets 408 and is closed: idle and byte-by-byte
    slow clients cannot hold descriptors for long. At ``max_connections`` a new connection
    closes the longest-idle one without a running request, or is refused with 503 when every
    connection is busy; so the descriptors never run out, and a flood of idle connections cannot
    lock out a client that sends its request.
    """

    def __init__(self, config: GuardedConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.header_timeout_s = config.header_timeout_s
        self.max_connections = config.max_connections
        self.metrics = config.metrics
        self.header_deadline: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        # A request is coming: the connection is new (opened to send one) or a request's first
        # bytes came; its headers are not complete yet.
        self.expecting_request = True
        self.closing = False  # shutdown came while a request was coming: answer it, then close
        self.lingering = False  # refused: answered, reading and dropping until the client closes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.metrics.connections.inc()
        self.idle_since = self.loop.time()
        if len(self.connections) > self.max_connections and not self._make_room():
            self.metrics.connections_closed.labels("refused").inc()
            self._answer_and_close(
                503, "too_many_connections",
                f"The server has {self.max_connections} busy connections (MAX_CONNECTIONS).",
                {"Retry-After": "1"},
            )
            return
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self.metrics.connections.dec()
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.expecting_request = True
        if self.header_deadline is None:  # the next request on a kept-alive connection
            self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self.expecting_request = False
        self._disarm_header_deadline()
        lag = self.config.loop_lag()
        if lag > self.config.max_loop_lag_s and not self._is_probe():
            # Behind: the request is answered here, by a handler that reads nothing and runs
            # no middleware, route or check, so that shedding a flood costs a fraction of
            # serving it and the probes below still get through.
            self.metrics.shed.inc()
            app, self.app = self.app, _overloaded(lag)
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()
        if self.closing and self.cycle is not None:
            self.cycle.keep_alive = False

    def _is_probe(self) -> bool:
        return httptools.parse_url(self.url).path in PROBE_PATHS

    def shutdown(self) -> None:
        """uvicorn closes a connection without a running request at once. One that is new or
        receiving a request's headers is given them (within the header deadline) and an answer
        first: closing it would reset the connection under a request the client has sent, or
        is sending on a connection it has just opened for it."""
        if self.expecting_request:
            self.closing = True
        else:
            super().shutdown()

    def on_response_complete(self) -> None:
        self.idle_since = self.loop.time()
        super().on_response_complete()

    @property
    def idle(self) -> bool:
        """No request running or queued: waiting for (the rest of) the next request's headers."""
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def _make_room(self) -> bool:
        """Close the longest-idle other connection, if the cap is really reached: one idle
        (opened, or last answered) EVICT_IDLE_S ago or more, with nothing unread. A client
        that has just connected, or just had its answer, sends its request at once, and under
        load the loop may not have read it yet (or the client not written it): closing that
        connection would drop a request already on its way."""
        open_ = [c for c in self.connections if c is not self and not c.transport.is_closing()
                 and not getattr(c, "lingering", False)]
        if len(open_) < self.max_connections:
            return True  # the excess are closing already
        now = self.loop.time()
        idle = [c for c in open_ if isinstance(c, GuardedHttpProtocol) and c.idle
                and now - c.idle_since >= EVICT_IDLE_S and not c.has_unread_bytes()]
        if not idle:
            return False
        min(idle, key=lambda c: c.idle_since).transport.close()
        self.metrics.connections_closed.labels("evicted").inc()
        return True

    def has_unread_bytes(self) -> bool:
        """Whether the client has sent bytes the loop has not read yet (the kernel's count)."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(waiting, sys.byteorder) > 0

    def data_received(self, data: bytes) -> None:
        if not self.lingering:  # after a refusal, what the client still sends is dropped
            super().data_received(data)

    def _arm_header_deadline(self) -> None:
        self.header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm_header_deadline(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _headers_late(self) -> None:
        self.header_deadline = None
        if self.transport.is_closing():
            return
        self.metrics.connections_closed.labels("header_timeout").inc()
        self._answer_and_close(
            408, "header_timeout",
            f"The request headers did not arrive within {self.header_timeout_s:g} s "
            "(HEADER_TIMEOUT_S).",
        )

    def _answer_and_close(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        if self.transport.is_closing():
            return
        body = json.dumps(error_body(code, message), separators=(",", ":")).encode()
        reason = {408: "Request Timeout", 503: "Service Unavailable"}[status]
        lines = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
                 f"content-length: {len(body)}", "connection: close"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.transport.write("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
        # A lingering close, as web servers do: closing with the client's request unread
        # would send a reset, which may reach the client before the answer and discard it.
        # The write side is shut; what the client still sends is read and dropped until it
        # closes, or for LINGER_S.
        lingering = sum(getattr(c, "lingering", False) for c in self.connections)
        self.lingering = True
        self._disarm_header_deadline()
        # Lingering holds a descriptor past the cap: at most LINGER_MAX at once, within the
        # descriptors RESERVED_FILES keeps, so a flood of refusals cannot exhaust them.
        if lingering < LINGER_MAX and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def _overloaded(lag: float) -> Callable[[Scope, Receive, Send], Any]:
    """An ASGI app answering 503 ``overloaded`` with Retry-After, and closing the connection:
    a client flooding the server with connections is given nothing to keep alive."""
    body = json.dumps(error_body("overloaded", f"The server is overloaded ({lag:.1f} s "
                                 "behind, MAX_LOOP_LAG_S); retry later."),
                      separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(max(1, round(lag))).encode()), (b"connection", b"close")]

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return answer


class CloseWhenStoppingMiddleware:
    """From the stop signal on, every response says ``Connection: close`` and the server closes
    the connection after it. A kept-alive connection the server closes when it stops may cross
    a request the client has just sent on it, which then gets a reset instead of an answer
    (HTTP lets a client retry only idempotent requests); after this, by the time the listener
    closes, the clients that sent during SHUTDOWN_DELAY_S hold no kept-alive connection."""

    def __init__(self, app: ASGIApp, stopping: Callable[[], bool]) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.stopping():
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"connection" for name, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


async def close_listeners(
    servers: Sequence[asyncio.Server], protocol_factory: Callable[[], asyncio.BaseProtocol]
) -> None:
    """Close the listening sockets without resetting the connections the kernel has completed
    on them and the event loop has not yet accepted, though their clients may have sent a
    request on them (under a stream of new connections the loop always has some waiting).

    The loop stops listening while copies of the sockets keep them open; the waiting
    connections are accepted from the copies, each copy closed at once after its last (a
    connection completed between the two is reset: a window of microseconds), and those
    connections are served through ``protocol_factory`` like any other."""
    copies = [socket.socket(fileno=os.dup(sock.fileno()))
              for server in servers for sock in server.sockets]
    for server in servers:
        server.close()
    accepted: list[socket.socket] = []
    for listener in copies:
        with listener:
            listener.setblocking(False)
            while True:
                try:
                    accepted.append(listener.accept()[0])
                except BlockingIOError:
                    break
                except ConnectionAbortedError:
                    continue
                except OSError as exc:  # out of descriptors: the rest are reset
                    log.warning("accepting the waiting connections at shutdown: %s", exc)
                    break
    loop = asyncio.get_running_loop()
    await asyncio.gather(*(loop.connect_accepted_socket(protocol_factory, sock)
                           for sock in accepted))


class BodyDeadlineMiddleware:
    """Fails a request whose body has not fully arrived ``timeout_s`` after its headers with
    408 (raised from the app's own read, so the error handlers shape it); reads after the body,
    such as waiting for the client to hang up, are not limited."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_read = False

        async def receive_by_deadline() -> Message:
            nonlocal body_read
            if body_read:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ApiError(
                    408, "body_timeout",
                    f"The request body did not arrive within {self.timeout_s:g} s "
                    "(BODY_TIMEOUT_S).",
                    headers={"Connection": "close"},
                ) from None
            body_read = message["type"] != "http.request" or not message.get("more_body")
            return message

        await self.app(scope, receive_by_deadline, send)


def fit_open_file_limit(max_connections: int) -> int:
    """Raise the soft open-file limit towards the hard one until ``max_connections`` fit beside
    the descriptors the process needs; return the connections that fit (``max_connections``,
    or fewer when the hard limit is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fitting = soft - RESERVED_FILES
    if fitting < 1:
        raise RuntimeError(
            f"the open-file limit ({soft}) leaves no room for connections; raise it "
            f"(docker run --ulimit nofile=...) above {RESERVED_FILES}"
        )
    log.warning(
        "MAX_CONNECTIONS %d lowered to %d to fit the open-file limit %d (hard limit %d)",
        max_connections, fitting, soft, hard,
    )
    return fitting
