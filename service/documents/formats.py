"""The formats a document may have: one entry each, naming how it is read into texts, how it
is written back around their translations, how those texts reach the Translator (their markup
and inline tags), and which file names, media type and APIs it has. Adding a format is adding
an entry here; the APIs read their lists of accepted files from this registry."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from service.documents.errors import DocumentError
from service.documents.plain import (
    READER_ATTRIBUTES,
    read_html,
    read_text,
    write_html,
    write_text,
)
from service.documents.xliff import XLIFF_INLINE, read_xliff, write_xliff


def _on_first_use(module: str, name: str) -> Callable[..., Any]:
    """``service.documents.<module>.<name>``, imported when first called: the libraries of
    the office, e-book, Markdown, catalogue and subtitle formats hold ~25 MiB once imported
    (python-docx and python-pptx alone 16), which a service that is never sent such a file
    need not hold (bench/memory.py)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        function = getattr(importlib.import_module(f"service.documents.{module}"), name)
        return function(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


read_epub, write_epub, epub_text = (_on_first_use("epub", name)
                                    for name in ("read_epub", "write_epub", "epub_text"))
read_markdown, write_markdown = (_on_first_use("markdown", name)
                                 for name in ("read_markdown", "write_markdown"))
read_odf, write_odf, odf_text = (_on_first_use("odf", name)
                                 for name in ("read_odf", "write_odf", "odf_text"))
read_docx, read_pptx, write_office, docx_text, pptx_text = (
    _on_first_use("office", name)
    for name in ("read_docx", "read_pptx", "write_office", "docx_text", "pptx_text"))
read_po, write_po = (_on_first_use("po", name) for name in ("read_po", "write_po"))
read_srt, read_vtt, write_srt, write_vtt = (
    _on_first_use("subtitles", name) for name in ("read_srt", "read_vtt", "write_srt", "write_vtt"))

# The APIs with a document route (the service's own, DeepL's and LibreTranslate's), by the
# name a refusal gives them.
API_ROUTES = {"native": "/translate/document", "deepl": "DeepL's /v2/document",
              "libretranslate": "LibreTranslate's /translate_file"}
APIS = frozenset(API_ROUTES)


@dataclass(frozen=True)
class DocumentFormat:
    name: str  # the job's kind, as recorded in the shared store
    extensions: tuple[str, ...]
    media_type: str  # the translated file's
    read: Callable[[Any], tuple[Any, list[str]]]  # the file (text or bytes) -> (document, texts)
    write: Callable[[Any, list[str]], str | bytes]  # (document, translations) -> the file
    # For a zipped format, read as bytes: its words (for limits and detection), else None.
    words: Callable[[bytes], str] | None = None
    markup: bool = False  # texts are markup, cut into segments (service.markup) when read
    inline_tags: tuple[str, ...] = ()  # elements besides HTML's that sit inside a sentence
    attributes: tuple[str, ...] = ()  # attributes a reader sees, translated too
    apis: frozenset[str] = APIS

    @property
    def binary(self) -> bool:
        return self.words is not None


_UTF8 = "; charset=utf-8"
RUN_TAGS = ("r", "tab", "lb")  # an office paragraph's runs, and the tabs and breaks in them
_OFFICE = "application/vnd.openxmlformats-officedocument."
_ODF = "application/vnd.oasis.opendocument."

REGISTRY = (
    DocumentFormat("text", (".txt",), "text/plain" + _UTF8, read_text, write_text),
    DocumentFormat("html", (".html", ".htm"), "text/html" + _UTF8, read_html, write_html,
                   markup=True, attributes=READER_ATTRIBUTES),
    DocumentFormat("markdown", (".md", ".markdown"), "text/markdown" + _UTF8, read_markdown,
                   write_markdown, markup=True, attributes=("alt", "title")),
    DocumentFormat("po", (".po", ".pot"), "text/x-gettext-translation" + _UTF8, read_po,
                   write_po),
    DocumentFormat("srt", (".srt",), "application/x-subrip" + _UTF8, read_srt, write_srt,
                   markup=True, inline_tags=("c",)),
    DocumentFormat("vtt", (".vtt",), "text/vtt" + _UTF8, read_vtt, write_vtt,
                   markup=True, inline_tags=("c",)),
    DocumentFormat("xliff", (".xlf", ".xliff"), "application/xliff+xml" + _UTF8, read_xliff,
                   write_xliff, markup=True, inline_tags=XLIFF_INLINE),
    DocumentFormat("docx", (".docx",), _OFFICE + "wordprocessingml.document", read_docx,
                   write_office, words=docx_text, markup=True, inline_tags=RUN_TAGS),
    DocumentFormat("pptx", (".pptx",), _OFFICE + "presentationml.presentation", read_pptx,
                   write_office, words=pptx_text, markup=True, inline_tags=RUN_TAGS),
    DocumentFormat("epub", (".epub",), "application/epub+zip", read_epub, write_epub,
                   words=epub_text, markup=True, attributes=READER_ATTRIBUTES),
    # One kind for both: an OpenDocument's media type is the one its extension names.
    DocumentFormat("odf", (".odt",), _ODF + "text", read_odf, write_odf, words=odf_text,
                   markup=True, inline_tags=("t",)),
    DocumentFormat("odf", (".odp",), _ODF + "presentation", read_odf, write_odf,
                   words=odf_text, markup=True, inline_tags=("t",)),
)
FORMATS = {entry.name: entry for entry in REGISTRY}  # by kind
BY_EXTENSION = {extension: entry for entry in REGISTRY for extension in entry.extensions}


def extensions(api: str = "native") -> list[str]:
    """The file extensions ``api``'s document route takes, sorted."""
    return sorted(extension for extension, entry in BY_EXTENSION.items() if api in entry.apis)


def document_format(filename: str, api: str = "native") -> DocumentFormat:
    """The format a file's extension names if ``api`` may take it (its registry entry's
    ``apis``), or a DocumentError naming the extension and listing those ``api`` takes."""
    if api not in APIS:
        raise ValueError(f"No document route is named {api!r}.")
    suffix = PurePath(filename).suffix.lower()
    entry = BY_EXTENSION.get(suffix)
    if entry is None:
        raise DocumentError(f"Invalid file extension '{suffix or filename}': this service "
                            f"translates {', '.join(extensions(api))}.")
    if api not in entry.apis:
        raise DocumentError(f"Invalid file extension '{suffix}': {API_ROUTES[api]} does not "
                            f"take {entry.name} files; it translates "
                            f"{', '.join(extensions(api))}.")
    return entry


def document_kind(filename: str) -> tuple[str, str]:
    """(kind, media type) by the file's extension, or a DocumentError."""
    entry = document_format(filename)
    return entry.name, entry.media_type
