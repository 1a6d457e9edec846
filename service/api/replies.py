"""How an API answers the pipeline's errors: a table from ``PipelineError.code`` to a
``Reply`` (status, wording, and for the service's own API its error code), so that each API
module holds its mapping as data, not as code paths; ``service.errors`` answers with it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from service.errors import ApiError, ErrorShape
from service.pipeline import PipelineError

# Codes of malformed requests, for the tables: every API answers them with its 400.
MALFORMED = ("invalid_encoding", "invalid_json", "invalid_body", "invalid_field",
             "missing_field", "unknown_field")


@dataclass(frozen=True)
class Reply:
    """``message`` is a template over the error's ``message``, ``value`` and ``field``; ``code``
    renames the error's code where an API has its own word for it."""

    status: int
    message: str = "{message}"
    code: str | None = None


# What no request can change: every API answers these alike, in its own shape.
SERVICE_SIDE: dict[str, Reply] = {
    **{code: Reply(503) for code in ("not_ready", "load_failed", "unavailable",
                                      "shutting_down", "worker_restarted", "no_healthy_worker",
                                      "overloaded", "model_unavailable")},
    "client_closed_request": Reply(499),
    "translation_failed": Reply(500),
    "timeout": Reply(504),
}


def reply_for(table: Mapping[str, Reply], error: PipelineError) -> Reply:
    # Codes a table leaves out are failures of the service, not of the request.
    return table.get(error.code) or Reply(500, "Internal server error.")


def headers_for(error: PipelineError) -> dict[str, str]:
    headers: dict[str, str] = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    if error.request_id:
        headers["X-Request-ID"] = error.request_id
    if error.code == "body_too_large":
        headers["Connection"] = "close"  # the rest of the body is not read
    return headers


def wording(reply: Reply, error: PipelineError) -> str:
    return reply.message.format(message=error.message, value=error.value or "",
                                field=error.field or "")


def table_error(table: Mapping[str, Reply], error: PipelineError) -> ApiError:
    """``error`` with the status, code and wording ``table`` gives it."""
    reply = reply_for(table, error)
    return ApiError(reply.status, reply.code or error.code, wording(reply, error), error.field,
                    headers_for(error))


def message_shape(table: Mapping[str, Reply], key: str) -> ErrorShape:
    """``{key: message}`` with the table's status: the error shape of LibreTranslate
    (``error``) and DeepL (``message``)."""
    return ErrorShape(lambda error: table_error(table, error),
                      lambda error: {key: error.message})
