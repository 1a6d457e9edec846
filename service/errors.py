"""How failures are answered. The service's own error shape is ``{"error": {"code",
"message", "field"?}}``: clients branch on ``code`` (stable, snake_case) and show ``message``
(human, may change); ``field`` names the offending request field as ``text`` or ``text[3]``
when there is one. The compatible APIs answer in their own shapes (``ErrorShape``).

Routes raise; the handlers installed here answer. Each API's routes carry its ``ErrorShape``
(``ShapedRoute``), so one handler renders a ``PipelineError`` through the table of the API
whose route raised it; what fails before a route is found (an unknown path) is answered in the
shape of the API whose path prefix it is under.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute, APIRouter
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.metrics import ASGIApp, Message, Receive, Scope, Send
from service.pipeline import PipelineError
from service.shared_state import StoreDown

log = logging.getLogger(__name__)

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "queue_full",
    503: "unavailable",
    504: "timeout",
}


class ApiError(Exception):
    """An expected failure with its HTTP status; raised anywhere below a route."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    return {"error": error}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(error.code, error.message, error.field),
        status_code=error.status,
        headers=error.headers,
    )


# pydantic puts the union member tried into the location: ("text", "list[str]", 1).
_UNION_TAG = re.compile(r"(str|int|float|bool|none|list\[.*\]|dict\[.*\])")


def field_name(loc: Sequence[str | int]) -> str | None:
    """("body", "text", "list[str]", 3) -> "text[3]"; the body itself has no field name."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    name = ""
    for part in parts:
        if isinstance(part, str) and name and _UNION_TAG.fullmatch(part):
            continue
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or None


def from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    """Map pydantic errors (from FastAPI or from our own parsing) to one ApiError."""
    if not errors:
        return ApiError(422, "invalid_field", "Invalid request.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return ApiError(400, "invalid_json", f"Body is not valid JSON: {detail}".rstrip(": "))
    field = field_name(first.get("loc", ()))
    if field is not None:
        # Of a union's errors ("text" is no string, "text[1]" is no string), the deepest is
        # the one that points at the culprit.
        same = [field_name(e.get("loc", ())) or "" for e in errors]
        field = max((f for f in same if f.startswith(field)), key=len)
    kind = first.get("type", "")
    if field is None:
        code = "invalid_body"
    elif kind == "missing":
        code = "missing_field"
    elif kind == "extra_forbidden":
        code = "unknown_field"
    else:
        code = "invalid_field"
    messages = []
    for error in errors[:5]:
        where = field_name(error.get("loc", ()))
        messages.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    if len(errors) > 5:
        messages.append(f"... and {len(errors) - 5} more")
    return ApiError(422, code, "; ".join(messages), field)


@dataclass(frozen=True)
class ErrorShape:
    """How one API answers a failure: ``of_pipeline`` is its table from the pipeline's error
    codes to its status codes and wording, ``body`` writes an error as its error object."""

    of_pipeline: Callable[[PipelineError], ApiError]
    body: Callable[[ApiError], dict[str, Any]]

    def response(self, error: ApiError) -> JSONResponse:
        return JSONResponse(self.body(error), error.status, headers=error.headers)


class ShapedRoute(APIRoute):
    """A route of one API; each API's router makes its routes of a subclass that names the
    API's ``error_shape``, in which the app's handlers answer whatever the route raises."""

    error_shape: ClassVar[ErrorShape]


class ErrorShapes:
    """Which API's shape a failure is answered in: that of the route the request reached,
    else (before routing: an unknown path, a middleware's refusal) that of the router whose
    prefix the path is under, else ``default``, the service's own."""

    def __init__(self, default: ErrorShape, routers: Iterable[APIRouter]) -> None:
        self.default = default
        self.by_prefix = {router.prefix: router.route_class.error_shape for router in routers
                          if router.prefix and issubclass(router.route_class, ShapedRoute)}

    def of(self, scope: Scope) -> ErrorShape:
        route = scope.get("route")
        if isinstance(route, ShapedRoute):
            return route.error_shape
        path = scope["path"]
        for prefix, shape in self.by_prefix.items():
            if path == prefix or path.startswith(prefix + "/"):
                return shape
        return self.default


def install_error_handlers(app: FastAPI, shapes: ErrorShapes) -> None:
    """Every failure a request meets, answered in the error shape of its API (``shapes``): a
    ``PipelineError`` through that API's table, the others (unknown routes, wrong methods,
    invalid requests, bugs) with their own status."""

    def respond(request: Request, error: ApiError) -> JSONResponse:
        return shapes.of(request.scope).response(error)

    @app.exception_handler(PipelineError)
    async def _pipeline_error(request: Request, exc: PipelineError) -> JSONResponse:
        shape = shapes.of(request.scope)
        return shape.response(shape.of_pipeline(exc))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return respond(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(request, from_validation_errors(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _validation(request: Request, exc: ValidationError) -> JSONResponse:
        return respond(request, from_validation_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        return respond(request, ApiError(exc.status_code, code, message, headers=exc.headers))

    @app.exception_handler(StoreDown)
    async def _store_down(request: Request, exc: StoreDown) -> JSONResponse:
        # What lives only in the shared store (a glossary, another replica's document).
        return respond(request, ApiError(
            503, "unavailable", "The shared state store (STATE_URL) does not answer; retry "
            "later.", headers={"Retry-After": str(exc.retry_after)}))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Reached only by bugs or engine failures, never by bad input: those are refused.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return respond(request, ApiError(500, "internal_error", "Internal server error."))


class CancelledRequestMiddleware:
    """A request cancelled before it answered gets 503 ``shutting_down`` in the one error shape.

    uvicorn cancels the requests still running when its shutdown timeout ends (a backstop past
    SHUTDOWN_GRACE_S, for what the scheduler's drain does not answer, such as a body still
    arriving), and would answer them with a bare text/plain 500.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = False

        async def send_and_note(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except asyncio.CancelledError:
            if not answered:
                error = ApiError(503, "shutting_down", "The service is shutting down.",
                                 headers={"Retry-After": "5", "Connection": "close"})
                with contextlib.suppress(Exception):  # the client may be gone too
                    await error_response(error)(scope, receive, send)
            raise
