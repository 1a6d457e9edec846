"""OpenDocument text and presentations (``.odt``, ``.odp``): content.xml read with lxml, each
paragraph's spans as inline tags; every other entry of the zip as it was."""

from __future__ import annotations

import html
import io
import zipfile
from dataclasses import dataclass

from lxml import etree

from service.documents.archives import check_zip, rezip
from service.documents.errors import DocumentError
from service.documents.safexml import SAFE_XML as _XML

_ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_ODF_PARAGRAPHS = (f"{{{_ODF_TEXT}}}p", f"{{{_ODF_TEXT}}}h")


@dataclass
class Odf:
    data: bytes
    content: etree._Element  # content.xml's root
    paragraphs: list[etree._Element]  # those translated, in order
    inline: list[list[etree._Element]]  # each paragraph's inline elements, in document order


def read_odf(data: bytes) -> tuple[Odf, list[str]]:
    """An OpenDocument text or presentation (a zip, checked first; content.xml read with
    lxml, no DTD or entities) and each paragraph or heading with text as one fragment: its
    inline elements (spans, links, spaces, tabs, line breaks) as ``<t i="k">`` tags, so the
    paragraph is one text and each span gets back the words the model kept inside it.
    Paragraphs holding other paragraphs (a footnote's) are left as they are."""
    check_zip(data, "OpenDocument file")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            content = etree.fromstring(archive.read("content.xml"), _XML)
    except (KeyError, etree.XMLSyntaxError) as exc:
        raise DocumentError(f"The OpenDocument file cannot be read: {exc}") from None
    paragraphs, inline, texts = [], [], []
    for paragraph in content.iter(*_ODF_PARAGRAPHS):
        if any(True for _ in paragraph.iterdescendants(*_ODF_PARAGRAPHS)):
            continue
        if not "".join(paragraph.itertext()).strip():
            continue
        elements = list(paragraph.iterdescendants())
        paragraphs.append(paragraph)
        inline.append(elements)
        texts.append(_odf_fragment(paragraph, {id(e): i for i, e in enumerate(elements)}))
    return Odf(data, content, paragraphs, inline), texts


def _odf_fragment(element: etree._Element, index: dict[int, int]) -> str:
    parts = [html.escape(element.text or "", quote=False)]
    for child in element:
        if isinstance(child.tag, str):
            inner = _odf_fragment(child, index)
            k = index[id(child)]
            parts.append(f'<t i="{k}">{inner}</t>' if inner else f'<t i="{k}"/>')
        parts.append(html.escape(child.tail or "", quote=False))
    return "".join(parts)


def write_odf(document: Odf, translations: list[str]) -> bytes:
    """content.xml with each paragraph's content rebuilt from its translation (its own
    inline elements, attributes and all, around the words the model put in them); the
    rest of the zip as it was, mimetype first and stored."""
    for paragraph, elements, translation in zip(document.paragraphs, document.inline,
                                                translations, strict=True):
        built = etree.fromstring(f"<w>{translation}</w>", _XML)
        for child in list(paragraph):
            paragraph.remove(child)
        _odf_rebuild(paragraph, built, elements)
    return rezip(document.data, {"content.xml": etree.tostring(
        document.content, encoding="UTF-8", xml_declaration=True)})


def _odf_rebuild(target: etree._Element, built: etree._Element,
                 elements: list[etree._Element]) -> None:
    target.text = built.text
    for tag in built:
        original = elements[int(tag.get("i"))]
        copy = etree.SubElement(target, original.tag, attrib=dict(original.attrib))
        _odf_rebuild(copy, tag, elements)
        copy.tail = tag.tail



def odf_text(data: bytes) -> str:
    """An OpenDocument's words, a paragraph a line."""
    return "\n".join("".join(p.itertext()) for p in read_odf(data)[0].paragraphs)
