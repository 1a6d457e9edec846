"""The routes that describe the service rather than translate (``/metrics``, the API docs and
OpenAPI document, LibreTranslate's ``/spec``): behind the API key when keys are set, unless
OPEN_DOCS opens them. Metrics name the loaded models and the traffic; a locked service should
not tell an unauthenticated client either."""

from __future__ import annotations

from fastapi import Request

from service.api.fields import key_of
from service.api.native import native_error
from service.errors import ErrorShapes
from service.metrics import ASGIApp, Receive, Scope, Send
from service.pipeline import PipelineError, check_key
from service.state import ServiceState

PRIVATE_PATHS = frozenset({"/metrics", "/docs", "/docs/oauth2-redirect", "/redoc",
                           "/openapi.json", "/libretranslate/spec"})


class PrivateRoutesMiddleware:
    """Refusals in the error shape of the API a path belongs to (``shapes``, as
    ``service.errors.install_error_handlers`` takes them); the status is the service's own
    (401) whatever the API."""

    def __init__(self, app: ASGIApp, state: ServiceState, shapes: ErrorShapes) -> None:
        self.app = app
        self.state = state
        self.shapes = shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = self.state.settings
        if (scope["type"] != "http" or scope["path"] not in PRIVATE_PATHS
                or not self.state.keys.required or settings.open_docs):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            check_key(self.state, request, key_of(request))
        except PipelineError as exc:
            response = self.shapes.of(scope).response(native_error(exc))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
