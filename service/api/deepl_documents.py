"""DeepL's document API under ``/v2``, as its clients call it: ``POST /v2/document``
(multipart: ``file``, ``target_lang``, ``source_lang``, ``glossary_id``; answers
``document_id`` and ``document_key``), ``POST /v2/document/{id}`` (``document_key``; answers
``status``, ``seconds_remaining``, ``billed_characters``, ``error_message``) and ``POST
/v2/document/{id}/result`` (the file, once; the document is deleted with its download).
Formats: ``service.documents``.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.api.deepl import (
    PREFIX,
    DeepLRoute,
    check_formality,
    header_key,
    key_fields,
    language_code,
)
from service.api.uploads import document_request, download, form_key
from service.documents import DONE, ERROR, DocumentJob
from service.pipeline import PipelineError, PipelineRequest, owner_of, start_document
from service.state import ServiceState

router = APIRouter(prefix=PREFIX, tags=["DeepL-compatible"], route_class=DeepLRoute)
UPLOAD_WAIT_S = 1.0  # the upload's answer waits this long for a short document to be done


@router.post("/document")
async def upload(request: Request) -> Response:
    """DeepL's ``POST /v2/document``."""
    state: ServiceState = request.app.state.service

    def parse(body: bytes) -> PipelineRequest:
        return document_request(body, request.headers.get("content-type", ""),
                                state.settings, api="deepl", source="source_lang",
                                target="target_lang", key="auth_key", glossary="glossary_id",
                                language=language_code, check=_check_fields)

    job = await start_document(state, request, parse, header_key(request), key_first=lambda body: (
        form_key(body, request.headers.get("content-type", ""), "auth_key")))
    # DeepL's clients ask for the status at once, then every 5 s: a short document done
    # within a moment is "done" at their first question rather than 5 s later.
    assert job.task is not None
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(job.task), UPLOAD_WAIT_S)
    return JSONResponse({"document_id": job.document_id, "document_key": job.document_key})


def _check_fields(fields: dict[str, str], filename: str) -> None:
    """What a document request may ask that this service cannot do: refused, not ignored."""
    check_formality(fields)
    wanted = fields.get("output_format", "").strip().lower()
    if wanted and not filename.lower().endswith(f".{wanted}"):
        raise PipelineError("invalid_field", "Value for 'output_format' not supported: the "
                            "translation has the uploaded file's format.", "output_format")


async def _job(request: Request, document_id: str) -> DocumentJob:
    state: ServiceState = request.app.state.service
    fields, key = await key_fields(request, state)
    # Another key's document is "not found" (not 403): a key cannot even learn it exists.
    job = await state.documents.get(document_id, str(fields.get("document_key") or ""),
                                    owner_of(state, key))
    if job is None:
        raise PipelineError("document_not_found", "Document not found.", "document_id")
    return job


@router.post("/document/{document_id}")
async def status(request: Request, document_id: str) -> Response:
    """DeepL's ``POST /v2/document/{id}``: the translation's status."""
    job = await _job(request, document_id)
    answer: dict[str, object] = {"document_id": job.document_id, "status": job.status}
    if job.status == DONE:
        answer.update(seconds_remaining=0, billed_characters=job.characters)
    if job.status == ERROR:
        answer["error_message"] = job.error
    return JSONResponse(answer)


@router.post("/document/{document_id}/result")
async def result(request: Request, document_id: str) -> Response:
    """DeepL's ``POST /v2/document/{id}/result``: the translated file, once."""
    state: ServiceState = request.app.state.service
    job = await _job(request, document_id)
    if job.status != DONE:
        raise PipelineError("document_not_ready", "Document translation is not done: "
                            f"{job.status}.", "document_id", retry_after=1)
    data = await state.documents.take(job)
    if data is None:
        raise PipelineError("document_not_found", "Document not found.", "document_id")
    return download(job, data)
