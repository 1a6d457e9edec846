"""XLIFF 1.2 and 2.0 (``.xlf``, ``.xliff``), read with lxml, no DTD or entity accepted: each
source without a translation, its inline codes kept through the markup machinery, written as
its target with the state a reviewer looks for."""

from __future__ import annotations

import html
from dataclasses import dataclass

from lxml import etree

from service.documents.errors import DocumentError
from service.documents.safexml import SAFE_XML as _XML

# XLIFF's inline codes (1.2: g x bx ex ph bpt ept it mrk sub; 2.0: pc ph sc ec mrk): the
# text around them is one sentence (service.markup's inline elements).
XLIFF_INLINE = ("g", "x", "bx", "ex", "ph", "bpt", "ept", "it", "mrk", "sub", "pc", "sc", "ec")
XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"


@dataclass
class Xliff:
    tree: etree._ElementTree
    version: str  # XLIFF_1 or XLIFF_2
    sources: list[etree._Element]  # the <source> elements to translate, in order


def read_xliff(text: str) -> tuple[Xliff, list[str]]:
    """An XLIFF 1.2 or 2.0 file and the content of each source that has no translation yet
    (1.2: a trans-unit without a non-empty target; 2.0: a segment likewise), inline codes
    (``<g>``, ``<x/>``, ``<ph>``, ``<pc>``, ...) and all, as an XML fragment."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise DocumentError("XLIFF files with a DTD or entity declarations are not accepted.")
    try:
        root = etree.fromstring(text.encode("utf-8"), _XML)
    except etree.XMLSyntaxError as exc:
        raise DocumentError(f"The XLIFF file cannot be read: {exc}") from None
    version = etree.QName(root).namespace
    if version not in (XLIFF_1, XLIFF_2):
        raise DocumentError(f"Not an XLIFF 1.2 or 2.0 file (namespace {version!r}).")
    unit = "trans-unit" if version == XLIFF_1 else "segment"
    sources = []
    for element in root.iter(f"{{{version}}}{unit}"):
        source = element.find(f"{{{version}}}source")
        target = element.find(f"{{{version}}}target")
        if source is not None and (target is None or not _inner(target).strip()):
            sources.append(source)
    return Xliff(root.getroottree(), version, sources), [_inner(s) for s in sources]


def _inner(element: etree._Element) -> str:
    """An element's content as XML, without the element's own tags or namespace noise."""
    parts = [html.escape(element.text or "", quote=False)]
    for child in element:
        parts.append(etree.tostring(child, encoding="unicode", with_tail=True))
    return "".join(parts).replace(f' xmlns="{etree.QName(element).namespace}"', "")


def write_xliff(document: Xliff, translations: list[str]) -> str:
    """Each translated source's target written (1.2: state needs-review-translation; 2.0:
    the segment's state translated), everything else as it came."""
    namespace = document.version
    for source, translation in zip(document.sources, translations, strict=True):
        holder = source.getparent()
        target = holder.find(f"{{{namespace}}}target")
        if target is None:
            target = etree.Element(f"{{{namespace}}}target")
            source.addnext(target)
            target.tail = source.tail
        parsed = etree.fromstring(f'<target xmlns="{namespace}">{translation}</target>', _XML)
        target.text = parsed.text
        for child in list(target):
            target.remove(child)
        for child in parsed:
            target.append(child)
        if namespace == XLIFF_1:
            target.set("state", "needs-review-translation")
        else:
            holder.set("state", "translated")
    return etree.tostring(document.tree, encoding="UTF-8", xml_declaration=True).decode()

