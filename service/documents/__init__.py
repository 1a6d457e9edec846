"""Documents: a file uploaded, translated in the background through the same Translator as
everyone's texts, and downloaded once done.

``formats`` holds one entry per format (how it is read and written, its extensions, media
type and APIs); a module per format family reads and writes it with its field's library;
``uploads`` reads the multipart body, ``archives`` checks zipped files, ``parsers`` reads
and writes files in worker processes of bounded memory, ``jobs`` runs the translations. What
each format translates and what it keeps: docs/documents.md.
"""

from service.documents.errors import DocumentError
from service.documents.formats import (
    BY_EXTENSION,
    FORMATS,
    REGISTRY,
    DocumentFormat,
    document_format,
    document_kind,
    extensions,
)
from service.documents.plain import paragraphs
from service.documents.uploads import Upload, document_text, read_upload

# The jobs (and the Translator they import) are loaded on first use: the worker processes that
# parse files (``parsers``) import the formats alone.
_JOBS = frozenset({"DONE", "ERROR", "QUEUED", "TRANSLATING", "DocumentJob", "DocumentJobs"})


def __getattr__(name: str) -> object:
    if name in _JOBS:
        from service.documents import jobs

        return getattr(jobs, name)
    raise AttributeError(f"module 'service.documents' has no attribute {name!r}")

__all__ = ["BY_EXTENSION", "DONE", "ERROR", "FORMATS", "QUEUED", "REGISTRY", "TRANSLATING",
           "DocumentError", "DocumentFormat", "DocumentJob", "DocumentJobs", "Upload",
           "document_format", "document_kind", "document_text", "extensions", "paragraphs",
           "read_upload"]
