"""Documents: a file uploaded, translated in the background through the same Translator as
everyone's texts, and downloaded once done.

``formats`` holds one entry per format (how it is read and written, its extensions, media
type and APIs); a module per format family reads and writes it with its field's library;
``uploads`` reads the multipart body, ``archives`` checks zipped files, ``jobs`` runs the
translations. What each format translates and what it keeps: docs/documents.md.
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
from service.documents.jobs import DONE, ERROR, QUEUED, TRANSLATING, DocumentJob, DocumentJobs
from service.documents.plain import paragraphs
from service.documents.uploads import Upload, document_text, read_upload

__all__ = ["BY_EXTENSION", "DONE", "ERROR", "FORMATS", "QUEUED", "REGISTRY", "TRANSLATING",
           "DocumentError", "DocumentFormat", "DocumentJob", "DocumentJobs", "Upload",
           "document_format", "document_kind", "document_text", "extensions", "paragraphs",
           "read_upload"]
