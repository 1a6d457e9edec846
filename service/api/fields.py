"""The fields of a request to a compatible API (LibreTranslate's, DeepL's): its clients send
JSON, form-encoded or query parameters, and a list as a repeated form field."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import JSONResponse

from service.api.shared import body_limit, read_body
from service.settings import Settings


class CompatError(Exception):
    """A refusal in a compatible API's own error shape: ``{field: message}`` with its status
    code; each API names ``field`` (LibreTranslate "error", DeepL "message")."""

    field = "error"

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({self.field: str(self)}, self.status, headers=self.headers)


class BadFields(ValueError):
    """The body cannot be read as fields; the message says why."""


async def request_fields(request: Request, settings: Settings, repeated: str) -> dict[str, Any]:
    """The query's fields, then a JSON body's or else a form body's, in which the field
    ``repeated`` is a list when given more than once."""
    body = await read_body(request, body_limit(settings))
    fields: dict[str, Any] = dict(request.query_params)
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            parsed = json.loads(body or b"{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise BadFields("Invalid JSON format") from None
        if not isinstance(parsed, dict):
            raise BadFields("Invalid JSON format: expected an object")
        fields.update(parsed)
    elif body:
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            raise BadFields("Invalid request: the body is not UTF-8") from None
        fields.update({k: v if k == repeated and len(v) > 1 else v[-1] for k, v in form.items()})
    return fields
