"""What the three APIs' document routes share: a multipart upload read into the pipeline's
request (``document_request``), and a finished document's download (``download``)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

from fastapi.responses import Response

from service.documents import (
    BINARY,
    INLINE_TAGS,
    STRUCTURED,
    TEXT_ATTRIBUTES,
    DocumentError,
    DocumentJob,
    document_kind,
    document_text,
    office_text,
    read_upload,
)
from service.pipeline import PipelineError, PipelineRequest
from service.settings import Settings
from service.translator import TranslateOptions


def document_request(body: bytes, content_type: str, settings: Settings, *,
                     source: str, target: str, key: str = "", glossary: str = "",
                     language: Callable[[str], str] = str.lower,
                     check: Callable[[dict[str, str], str], None] | None = None,
                     ) -> PipelineRequest:
    """The upload in ``body`` as a request of one text, the document's; ``source``,
    ``target``, ``key`` and ``glossary`` name the API's form fields, ``language`` reads its
    language codes, ``check`` (given the fields and the file's name) refuses the API's other
    fields it cannot honour. A source left out (or "auto") is detected."""
    try:
        upload = read_upload(body, content_type)
        kind, media_type = document_kind(upload.filename)
        if kind in BINARY:  # the words, for limits and detection; the file goes as it came
            text = office_text(kind, upload.data)
            if len(text) > settings.max_document_chars:
                raise DocumentError(f"The document has {len(text)} characters; at most "
                                    f"{settings.max_document_chars} (MAX_DOCUMENT_CHARS).",
                                    status=413)
        else:
            text = document_text(upload.data, settings.max_document_chars)
            if kind in STRUCTURED:  # refused now, with a 400, rather than failing as a job
                STRUCTURED[kind][0](text)
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
    # HTML, XLIFF's sources, Markdown's inlines and an office paragraph's runs keep their
    # markup.
    marked = ("html", "xliff", "markdown", *BINARY)
    options = TranslateOptions(format="html" if kind in marked else "text",
                               inline_tags=INLINE_TAGS.get(kind, ()),
                               attributes=TEXT_ATTRIBUTES.get(kind, ()))
    return PipelineRequest([text], options, source=from_language,
                           target=language(fields[target]), detect=from_language is None,
                           key=fields.get(key, "").strip() if key else "",
                           glossary_id=glossary_id or None,
                           document=(upload.filename, media_type, kind),
                           document_data=upload.data if kind in BINARY else None)


def translated_name(filename: str) -> str:
    return filename or "document.txt"


def download(job: DocumentJob, data: bytes) -> Response:
    """The translated file, named as the upload was."""
    name = translated_name(job.filename)
    return Response(data, media_type=job.media_type, headers={
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}"})
