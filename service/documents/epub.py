"""EPUB books: the XHTML content documents the package lists, each translated as HTML; every
other entry of the zip as it was."""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

from lxml import etree

from service import markup
from service.documents.archives import check_zip, rezip
from service.documents.errors import DocumentError
from service.documents.plain import READER_ATTRIBUTES
from service.documents.safexml import SAFE_XML as _XML

_CONTAINER = "{urn:oasis:names:tc:opendocument:xmlns:container}"
_OPF = "{http://www.idpf.org/2007/opf}"


@dataclass
class Epub:
    data: bytes
    chapters: list[str]  # the XHTML content documents' names in the zip, in spine order


def read_epub(data: bytes) -> tuple[Epub, list[str]]:
    """An EPUB (a zip, checked first) and its XHTML content documents, each one HTML text
    (``service.markup`` keeps their markup). The package document is found through
    META-INF/container.xml and read with lxml (no DTD, entities or network)."""
    check_zip(data, "EPUB file")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            container = etree.fromstring(archive.read("META-INF/container.xml"), _XML)
            rootfile = container.find(f".//{_CONTAINER}rootfile")
            if rootfile is None:
                raise DocumentError("The EPUB file names no package document.")
            package_path = rootfile.get("full-path", "")
            package = etree.fromstring(archive.read(package_path), _XML)
            base = package_path.rsplit("/", 1)[0] + "/" if "/" in package_path else ""
            items = {item.get("id"): base + (item.get("href") or "")
                     for item in package.iter(f"{_OPF}item")
                     if item.get("media-type") == "application/xhtml+xml"}
            order = [ref.get("idref") for ref in package.iter(f"{_OPF}itemref")]
            chapters = [items[i] for i in order if i in items]
            chapters += [name for name in items.values() if name not in chapters]
            texts = [archive.read(name).decode("utf-8") for name in chapters]
    except (KeyError, etree.XMLSyntaxError, UnicodeDecodeError) as exc:
        raise DocumentError(f"The EPUB file cannot be read: {exc}") from None
    return Epub(data, chapters), texts


def write_epub(document: Epub, translations: list[str]) -> bytes:
    """The EPUB with its content documents translated, every other entry as it was, and
    ``mimetype`` first and stored, as the format requires."""
    return rezip(document.data, {name: text.encode("utf-8") for name, text in
                                 zip(document.chapters, translations, strict=True)})



def epub_text(data: bytes) -> str:
    """An EPUB's words: its content documents' texts without their markup."""
    return "\n".join(segment for chapter in read_epub(data)[1]
                     for segment in markup.parse(chapter, READER_ATTRIBUTES).segments)

