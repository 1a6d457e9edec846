"""OpenDocument text and presentations (``.odt``, ``.odp``): content.xml read with lxml, each
paragraph's spans as inline tags; every other entry of the zip as it was."""

from __future__ import annotations

import html
import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

from lxml import etree

from service.documents.archives import check_zip, rezip
from service.documents.errors import DocumentError
from service.documents.safexml import SAFE_XML as _XML

_ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_ODF_DRAW = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"
_ODF_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_ODF_SVG = "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0"
_ODF_PARAGRAPHS = (f"{{{_ODF_TEXT}}}p", f"{{{_ODF_TEXT}}}h")
# A picture's or a shape's title and description: a screen reader reads them out and an
# office suite shows them as the picture's tooltip. Translated each as one text.
_ODF_LABELS = (f"{{{_ODF_SVG}}}title", f"{{{_ODF_SVG}}}desc")
_NOTE = f"{{{_ODF_TEXT}}}note"
_MASTER_STYLES = f"{{{_ODF_OFFICE}}}master-styles"


@dataclass
class Odf:
    data: bytes
    parts: dict[str, etree._Element]  # the XML entries with text, by name in the zip
    paragraphs: list[etree._Element]  # those translated, in order
    inline: list[list[etree._Element]]  # each paragraph's inline elements, in document order


def read_odf(data: bytes) -> tuple[Odf, list[str]]:
    """An OpenDocument text or presentation (a zip, checked first; its XML read with lxml, no
    DTD or entities) and each paragraph or heading with text as one fragment: its inline
    elements (spans, links, spaces, tabs, line breaks) as ``<t i="k">`` tags, so the
    paragraph is one text and each span gets back the words the model kept inside it.
    The paragraphs are those of content.xml, of the page headers and footers in styles.xml
    and of embedded objects (``Object 1/content.xml``); a picture's or a shape's title and
    description (``svg:title``, ``svg:desc``) are one text each. A frame or a note anchored in a
    paragraph is one empty tag in its sentence, kept whole where the model puts it; its own
    paragraphs (a text box's, a caption's, a footnote's) are translated each on its own."""
    check_zip(data, "OpenDocument file")
    parts: dict[str, etree._Element] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            for name in ("content.xml", "styles.xml",
                         *(n for n in names if n.endswith("/content.xml"))):
                if name in names or name == "content.xml":
                    parts[name] = etree.fromstring(archive.read(name), _XML)
    except (KeyError, etree.XMLSyntaxError) as exc:
        raise DocumentError(f"The OpenDocument file cannot be read: {exc}") from None
    paragraphs, inline, texts, translated = [], [], [], set()
    for name, root in parts.items():
        scopes = root.iter(_MASTER_STYLES) if name == "styles.xml" else [root]
        for scope in scopes:
            for paragraph in scope.iter(*_ODF_PARAGRAPHS, *_ODF_LABELS):
                elements = list(_inline(paragraph))
                index = {id(e): i for i, e in enumerate(elements)}
                if not _own_text(paragraph).strip():
                    continue
                paragraphs.append(paragraph)
                inline.append(elements)
                texts.append(_odf_fragment(paragraph, index))
                translated.add(name)
    # Only the entries with text are written again; the others go back byte for byte.
    parts = {name: root for name, root in parts.items() if name in translated}
    return Odf(data, parts, paragraphs, inline), texts


def _anchored(element: etree._Element) -> bool:
    """A frame, a shape or a note sitting in a paragraph: kept whole, not part of its text."""
    return (etree.QName(element).namespace == _ODF_DRAW or element.tag == _NOTE
            or any(True for _ in element.iterdescendants(*_ODF_PARAGRAPHS)))


def _inline(element: etree._Element) -> Iterator[etree._Element]:
    """A paragraph's inline elements in document order, an anchored one without its inside."""
    for child in element:
        if isinstance(child.tag, str):
            yield child
            if not _anchored(child):
                yield from _inline(child)


def _own_text(element: etree._Element) -> str:
    parts = [element.text or ""]
    for child in element:
        if isinstance(child.tag, str) and not _anchored(child):
            parts.append(_own_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _odf_fragment(element: etree._Element, index: dict[int, int]) -> str:
    parts = [html.escape(element.text or "", quote=False)]
    for child in element:
        if isinstance(child.tag, str):
            inner = "" if _anchored(child) else _odf_fragment(child, index)
            k = index[id(child)]
            parts.append(f'<t i="{k}">{inner}</t>' if inner else f'<t i="{k}"/>')
        parts.append(html.escape(child.tail or "", quote=False))
    return "".join(parts)


def write_odf(document: Odf, translations: list[str]) -> bytes:
    """Each paragraph's content rebuilt from its translation (its own inline elements,
    attributes and all, around the words the model put in them; an anchored frame or note
    moved back whole); the rest of the zip as it was, mimetype first and stored."""
    for paragraph, elements, translation in zip(document.paragraphs, document.inline,
                                                translations, strict=True):
        built = etree.fromstring(f"<w>{translation}</w>", _XML)
        for child in list(paragraph):
            paragraph.remove(child)
        placed = _odf_rebuild(paragraph, built, elements)
        for element in elements:  # a frame the translation lost still belongs here
            if _anchored(element) and id(element) not in placed:
                element.tail = None
                paragraph.append(element)
    return rezip(document.data, {name: etree.tostring(root, encoding="UTF-8",
                                                      xml_declaration=True)
                                 for name, root in document.parts.items()})


def _odf_rebuild(target: etree._Element, built: etree._Element,
                 elements: list[etree._Element]) -> set[int]:
    """``target``'s content from ``built``; the ids of the anchored elements put back."""
    target.text = built.text
    placed: set[int] = set()
    for tag in built:
        original = elements[int(tag.get("i"))]
        if _anchored(original):
            if id(original) in placed:
                continue
            target.append(original)
            placed.add(id(original))
            original.tail = tag.tail
            continue
        copy = etree.SubElement(target, original.tag, attrib=dict(original.attrib))
        placed |= _odf_rebuild(copy, tag, elements)
        copy.tail = tag.tail
    return placed


def odf_text(data: bytes) -> str:
    """An OpenDocument's words, a paragraph a line."""
    document = read_odf(data)[0]
    return "\n".join(_own_text(p) for p in document.paragraphs)
