"""The fields of a request to a compatible API (LibreTranslate's, DeepL's): its clients send
JSON, form-encoded or query parameters, and a list as a repeated form field."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import pydantic_core
from fastapi import Request
from starlette.datastructures import Headers, QueryParams

from service.pipeline import PipelineError


def compat_fields(body: bytes, headers: Headers, query: QueryParams, repeated: str,
                  ) -> dict[str, Any]:
    """The query's fields, then a JSON body's or else a form body's, in which the field
    ``repeated`` is a list when given more than once. Malformed bodies (bad UTF-8, lone
    surrogates, nesting deeper than the parser's limit) are ``PipelineError``s."""
    fields: dict[str, Any] = dict(query)
    if headers.get("content-type", "").startswith("application/json"):
        try:
            # The Rust parser refuses lone surrogates and caps nesting, where json.loads
            # returns unencodable strings and raises RecursionError.
            parsed = pydantic_core.from_json(body or b"{}")
        except ValueError as exc:
            raise PipelineError("invalid_json", f"Invalid JSON format: {exc}") from None
        if not isinstance(parsed, dict):
            raise PipelineError("invalid_json", "Invalid JSON format: expected an object")
        fields.update(parsed)
    elif body:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PipelineError("invalid_encoding",
                                f"The body is not UTF-8 (byte {exc.start}).") from None
        try:
            form = parse_qs(text, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:  # a percent-escaped byte that is not UTF-8
            raise PipelineError("invalid_encoding", "A form field is not UTF-8.") from None
        fields.update({k: v if k == repeated and len(v) > 1 else v[-1] for k, v in form.items()})
    return fields


def text_list(value: Any, name: str) -> list[str]:
    """A field that holds one string or a list of strings, as a list."""
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in values):
        raise PipelineError("invalid_field", f"{name} must be a string or a list of strings",
                            name)
    return values


def key_of(request: Request) -> str:
    """A key as any of the APIs carries it in a request without a body: a bearer token,
    DeepL's ``DeepL-Auth-Key`` header, or an ``api_key`` query parameter (for a browser)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() in ("bearer", "deepl-auth-key") and token.strip():
        return token.strip()
    return request.query_params.get("api_key", "")
