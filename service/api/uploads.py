"""What the three APIs' document routes share: a multipart upload read into the pipeline's
request (``document_request``), and a finished document's download (``download``)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from fastapi.responses import Response

from service.documents import (
    DocumentError,
    DocumentJob,
    document_format,
    read_upload,
)
from service.documents.parsers import parsers, upload_words
from service.pipeline import PipelineError, PipelineRequest
from service.settings import Settings
from service.translator import TranslateOptions


def document_request(body: bytes, content_type: str, settings: Settings, *, api: str,
                     source: str, target: str, key: str = "", glossary: str = "",
                     language: Callable[[str], str] = str.lower,
                     check: Callable[[dict[str, str], str], None] | None = None,
                     ) -> PipelineRequest:
    """The upload in ``body`` as a request of one text, the document's, if its format is one
    the registry lets ``api`` take (``service.documents.formats``); ``source``,
    ``target``, ``key`` and ``glossary`` name the API's form fields, ``language`` reads its
    language codes, ``check`` (given the fields and the file's name) refuses the API's other
    fields it cannot honour. A source left out (or "auto") is detected."""
    try:
        upload = read_upload(body, content_type)
        file_format = document_format(upload.filename, api)
        # In a worker process of capped memory, the event loop's GIL untouched: a zip's
        # entries inflated and their text and elements counted before its reader builds a
        # tree, its words read; a text file decoded and read.
        what = f"{file_format.extensions[0][1:].upper()} file"
        text = parsers(settings.document_workers, settings.document_worker_mb).run(
            upload_words, file_format.name, upload.data, settings.max_document_chars, what)
    except DocumentError as exc:
        code = "document_too_large" if exc.status == 413 else "invalid_document"
        raise PipelineError(code, str(exc), exc.field) from None
    fields = upload.fields
    if check is not None:
        check(fields, upload.filename)
    if not fields.get(target):
        raise PipelineError("missing_field", f"Value for '{target}' not specified.", target)
    given = fields.get(source, "").strip()
    from_language = language(given) if given and given.lower() != "auto" else None
    glossary_id = fields.get(glossary) if glossary else None
    # Plain text: a markup format's markup is cut off in the worker processes that read the
    # file (``parsers.read_texts``), and its segments go to the Translator as texts.
    return PipelineRequest([text], TranslateOptions(), source=from_language,
                           target=language(fields[target]), detect=from_language is None,
                           key=fields.get(key, "").strip() if key else "",
                           glossary_id=glossary_id or None,
                           document=(upload.filename, file_format.media_type,
                                     file_format.name),
                           document_data=upload.data)


def form_key(body: bytes, content_type: str, field: str) -> str:
    """The API key an upload carries in its form ``field``, read before the file is unpacked
    or parsed, so that a wrong key costs no more than reading the form. A body that is not a
    form has none: the key is then refused, or parsing names the body's fault."""
    try:
        return read_upload(body, content_type).fields.get(field, "").strip()
    except DocumentError:
        return ""


def translated_name(filename: str) -> str:
    return filename or "document.txt"


def download(job: DocumentJob, data: bytes) -> Response:
    """The translated file, named as the upload was."""
    name = translated_name(job.filename)
    return Response(data, media_type=job.media_type, headers={
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}"})
