"""EPUB books: the XHTML content documents the package lists (the navigation document among
them), each translated as HTML; EPUB 2's table of contents (``toc.ncx``) and the package's
title and description; every other entry of the zip as it was."""

from __future__ import annotations

import html
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
_NCX = "{http://www.daisy.org/z3986/2005/ncx/}"
_DC = "{http://purl.org/dc/elements/1.1/}"
# What a reader's library and table of contents show of a book besides its pages: the
# package's title and description, and toc.ncx's title and entries (``navLabel/text``).
_METADATA = (f"{_DC}title", f"{_DC}description")
_NCX_TYPE = "application/x-dtbncx+xml"


@dataclass
class Epub:
    data: bytes
    chapters: list[str]  # the XHTML content documents' names in the zip, in spine order
    labels: list[etree._Element]  # the package's title and description, toc.ncx's texts
    parts: dict[str, etree._Element]  # the XML entries holding them, by name in the zip


def read_epub(data: bytes) -> tuple[Epub, list[str]]:
    """An EPUB (a zip, checked first) and its texts: each XHTML content document as one
    HTML text (``service.markup`` keeps their markup), then the package's title and
    description and the title and entries of an EPUB 2 table of contents (``toc.ncx``), each
    one text. The package document is found through META-INF/container.xml and read with
    lxml (no DTD, entities or network), as toc.ncx is."""
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
            parts = {package_path: package}
            for item in package.iter(f"{_OPF}item"):
                if item.get("media-type") == _NCX_TYPE:
                    name = base + (item.get("href") or "")
                    parts[name] = etree.fromstring(archive.read(name), _XML)
    except (KeyError, etree.XMLSyntaxError, UnicodeDecodeError) as exc:
        raise DocumentError(f"The EPUB file cannot be read: {exc}") from None
    labels = [element for root in parts.values()
              for element in root.iter(*_METADATA, f"{_NCX}text")
              if (element.text or "").strip() and not len(element)]
    texts += [html.escape(element.text or "", quote=False) for element in labels]
    # Only the entries with a text are written again; the others go back byte for byte.
    holders = {id(element.getroottree().getroot()) for element in labels}
    parts = {name: root for name, root in parts.items() if id(root) in holders}
    return Epub(data, chapters, labels, parts), texts


def write_epub(document: Epub, translations: list[str]) -> bytes:
    """The EPUB with its content documents, title, description and table of contents
    translated, every other entry as it was, and ``mimetype`` first and stored, as the format
    requires."""
    count = len(document.chapters)
    for element, translation in zip(document.labels, translations[count:], strict=True):
        element.text = html.unescape(translation)
    entries = {name: text.encode("utf-8") for name, text in
               zip(document.chapters, translations[:count], strict=True)}
    entries.update((name, etree.tostring(root.getroottree(), encoding="utf-8",
                                         xml_declaration=True))
                   for name, root in document.parts.items())
    return rezip(document.data, entries)



def epub_text(data: bytes) -> str:
    """An EPUB's words: its content documents' texts without their markup, its title,
    description and table of contents."""
    document, texts = read_epub(data)
    return "\n".join([*(segment for chapter in texts[:len(document.chapters)]
                        for segment in markup.parse(chapter, READER_ATTRIBUTES).segments),
                      *(element.text or "" for element in document.labels)])

