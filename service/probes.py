"""The probe port (PROBE_PORT): ``/health``, ``/ready`` and ``/metrics`` on a listener of their
own, in the same process and event loop as the API, answered by the same app and routes.

A flood of new connections fills the API port's listen queue, and past it the kernel drops
connections unanswered, the kubelet's probes among them: it would then restart, or take out
of service, a server that works. A second listener has a queue of its own that no client of
the API reaches, so the probes get through as long as the event loop turns. Every other path
is 404 there, so that the port opens nothing the API port does not already serve.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn

from service.connections import PROBE_PATHS, GuardedConfig
from service.errors import error_body
from service.metrics import ASGIApp, Metrics, Receive, Scope, Send

# The probe port's clients: the kubelet (a connection per probe) and a scraper or two. Their
# descriptors fit in those the process keeps besides client connections (RESERVED_FILES).
PROBE_CONNECTIONS = 16
PATHS = frozenset(path.decode() for path in PROBE_PATHS)


class ProbeRoutes:
    """The app, for the probe paths only; any other path gets a 404 in the service's shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PATHS:
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_body(
            "not_found", f"The probe port serves only {', '.join(sorted(PATHS))}."),
            separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 404, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class ProbeServer(uvicorn.Server):
    """A uvicorn server for the probe port, started and stopped by the API's server (its
    lifespan, the app's, runs once, there): it captures no signal and has no lifespan."""

    def __init__(self, app: ASGIApp, *, host: str, port: int, metrics: Metrics,
                 header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(GuardedConfig(
            ProbeRoutes(app), host=host, port=port, lifespan="off", ws="none",
            log_config=None, header_timeout_s=header_timeout_s,
            max_connections=PROBE_CONNECTIONS, metrics=metrics, **kwargs))
        self._ticking: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen; exits the process (uvicorn's startup failure) when the port is taken."""
        self.config.load()
        self.lifespan = self.config.lifespan_class(self.config)
        await self.startup()
        # uvicorn's tick keeps the Date header current (and would notice should_exit).
        self._ticking = asyncio.get_running_loop().create_task(self.main_loop())

    async def stop(self) -> None:
        """Close the listener and its connections (a probe answered first)."""
        self.should_exit = True
        if self._ticking is not None:
            await self._ticking
        await self.shutdown()
