"""Documents: a file uploaded, translated in the background through the same Translator (and
so the same continuous batching) as everyone's texts, and downloaded once done.

Formats: plain text (``.txt``: its paragraphs, blank-line separated, translated with their
layout kept), HTML (``.html``, ``.htm``: the markup kept, ``service.markup``), Markdown
(``.md``, ``.markdown``: ``service.markdown``), gettext catalogues (``.po``, ``.pot``, read
and written with polib: each untranslated message and its plural translated, marked fuzzy
for a human to review; messages already translated, the header, contexts, comments and flags
kept) and subtitles (SubRip ``.srt`` with the srt library, WebVTT ``.vtt`` with webvtt-py:
numbering, identifiers, timing, cue settings and notes kept, each subtitle's lines
translated together) and XLIFF 1.2 and 2.0 (``.xlf``, ``.xliff``, with lxml, no DTD or
entity accepted: each source without a translation, its inline codes kept through the markup
machinery, written as its target with the state a reviewer looks for), and Word documents
(``.docx``, with python-docx: paragraphs of the body, table cells, headers and footers,
footnotes and endnotes, each paragraph one text with its runs as inline tags; the zip
checked first) and presentations (``.pptx``, with python-pptx: text frames, grouped shapes,
table cells, speaker notes, likewise), and EPUB books (``.epub``: the XHTML content
documents its package lists, as HTML; the rest of the zip as it was) and OpenDocument text
and presentations (``.odt``, ``.odp``: content.xml with lxml, each paragraph's spans as
inline tags). A text file is read as UTF-8 (a byte-order mark allowed). ``read_upload``
takes the file out of a multipart/form-data body (the standard library's email parser) with
the other form fields.

Jobs (``DocumentJobs``) run in the process that accepted them, at most MAX_DOCUMENTS at
once, each kept DOCUMENT_TTL_S after it finished, and deleted once downloaded. Each has a
``document_key``, a secret its uploader must show to see its status or download it (DeepL's
scheme). With a shared state store (STATE_URL) each job's record (its key's digest, status,
file name) is written there before its id is answered and again when it ends, with the
translated file, both expiring after DOCUMENT_TTL_S: a client that polls another replica reads
its status and downloads its file there. While a job runs, its replica renews a lease beside
the record every third of DOCUMENT_LEASE_S; a running job whose lease has lapsed (its replica
died) reads as failed on every other replica, rather than running until its record expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import hmac
import html
import io
import json
import re
import secrets
import time
import uuid
import zipfile
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import PurePath

import docx
import docx.document
import docx.opc.constants
import docx.opc.part
import docx.oxml.ns
import docx.text.paragraph
import docx.text.run
import polib
import pptx
import pptx.enum.shapes
import pptx.presentation
import redis.asyncio
import srt
import webvtt
from lxml import etree

from service import markup
from service.markdown import read_markdown, write_markdown
from service.shared_state import PREFIX, StateStore, StoreDown, digest, stored_owner
from service.translator import Pair, TextResult

FORMATS = {".txt": ("text", "text/plain; charset=utf-8"),
           ".html": ("html", "text/html; charset=utf-8"),
           ".htm": ("html", "text/html; charset=utf-8"),
           ".md": ("markdown", "text/markdown; charset=utf-8"),
           ".markdown": ("markdown", "text/markdown; charset=utf-8"),
           ".po": ("po", "text/x-gettext-translation; charset=utf-8"),
           ".pot": ("po", "text/x-gettext-translation; charset=utf-8"),
           ".srt": ("srt", "application/x-subrip; charset=utf-8"),
           ".vtt": ("vtt", "text/vtt; charset=utf-8"),
           ".xlf": ("xliff", "application/xliff+xml; charset=utf-8"),
           ".xliff": ("xliff", "application/xliff+xml; charset=utf-8"),
           ".docx": ("docx", "application/vnd.openxmlformats-officedocument."
                             "wordprocessingml.document"),
           ".pptx": ("pptx", "application/vnd.openxmlformats-officedocument."
                             "presentationml.presentation"),
           ".epub": ("epub", "application/epub+zip"),
           ".odt": ("odf", "application/vnd.oasis.opendocument.text"),
           ".odp": ("odf", "application/vnd.oasis.opendocument.presentation")}
BINARY = frozenset({"docx", "pptx", "epub", "odf"})  # read as bytes, not as UTF-8 text
# A DOCX is a zip: refused when it would unpack to more than this, or at a ratio above this
# (a zip bomb), before python-docx opens it.
MAX_UNPACKED_BYTES, MAX_ZIP_RATIO = 200_000_000, 200
QUEUED, TRANSLATING, DONE, ERROR = "queued", "translating", "done", "error"


class DocumentError(ValueError):
    """An upload that cannot be translated; ``field`` names the form field at fault."""

    def __init__(self, message: str, field: str = "file", status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass
class Upload:
    filename: str
    data: bytes
    fields: dict[str, str]


def read_upload(body: bytes, content_type: str, file_field: str = "file") -> Upload:
    """The file and the other fields of a multipart/form-data body."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise DocumentError("Send the document as multipart/form-data, in a field named "
                            f"'{file_field}'.", file_field)
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise DocumentError("The multipart/form-data body cannot be read.", file_field)
    fields: dict[str, str] = {}
    upload: Upload | None = None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        payload = part.get_payload(decode=True) or b""
        if name == file_field:
            upload = Upload(part.get_filename() or "", payload, fields)
        else:
            fields[str(name)] = payload.decode("utf-8", errors="replace")
    if upload is None:
        raise DocumentError(f"No file: send it in the field '{file_field}'.", file_field)
    return upload


def document_kind(filename: str) -> tuple[str, str]:
    """("text" | "html", media type) by the file's extension, or a DocumentError."""
    suffix = PurePath(filename).suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(sorted(FORMATS))
        raise DocumentError(f"Invalid file extension '{suffix or filename}': this service "
                            f"translates {known}.")
    return FORMATS[suffix]


def document_text(data: bytes, max_chars: int) -> str:
    if not data:
        raise DocumentError("The file is empty.")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"The file is not UTF-8 text (byte {exc.start}).") from None
    if len(text) > max_chars:
        raise DocumentError(f"The document has {len(text)} characters; at most {max_chars} "
                            "(MAX_DOCUMENT_CHARS).", status=413)
    return text


_BLANK_LINES = re.compile(r"(\n[ \t]*\n\s*)")


def paragraphs(text: str) -> tuple[list[str], list[str]]:
    """A plain text's paragraphs (split at blank lines) and the blank lines between them:
    ``paragraphs[0] + separators[0] + paragraphs[1] + ...``. A long document is so many
    texts of moderate size for the Translator, whose limits are per text."""
    parts = _BLANK_LINES.split(text)
    return parts[0::2], parts[1::2]


def read_po(text: str) -> tuple[polib.POFile, list[str]]:
    """A catalogue and the texts to translate: each untranslated message's msgid (and its
    msgid_plural, after it)."""
    try:
        catalogue = polib.pofile(text)
    except (OSError, ValueError) as exc:
        raise DocumentError(f"The catalogue cannot be read: {exc}") from None
    texts = []
    for entry in _untranslated(catalogue):
        texts.append(entry.msgid)
        if entry.msgid_plural:
            texts.append(entry.msgid_plural)
    return catalogue, texts


def _untranslated(catalogue: polib.POFile) -> list[polib.POEntry]:
    return [entry for entry in catalogue if not entry.obsolete and entry.msgid
            and not entry.translated() and "fuzzy" not in entry.flags]


def write_po(catalogue: polib.POFile, translations: list[str]) -> str:
    """The catalogue with the translations in (plural forms: every form after the first gets
    the plural's), each marked fuzzy."""
    given = iter(translations)
    for entry in _untranslated(catalogue):
        singular = next(given)
        if entry.msgid_plural:
            plural = next(given)
            forms = max(2, len(entry.msgstr_plural))
            entry.msgstr_plural = {0: singular, **dict.fromkeys(range(1, forms), plural)}
        else:
            entry.msgstr = singular
        entry.flags.append("fuzzy")
    return str(catalogue)


def read_srt(text: str) -> tuple[list[srt.Subtitle], list[str]]:
    try:
        subtitles = list(srt.parse(text))
    except srt.SRTParseError as exc:
        raise DocumentError(f"The subtitles cannot be read: {exc}") from None
    return subtitles, [subtitle.content for subtitle in subtitles]


def write_srt(subtitles: list[srt.Subtitle], translations: list[str]) -> str:
    for subtitle, content in zip(subtitles, translations, strict=True):
        subtitle.content = content
    return srt.compose(subtitles, reindex=False)


def read_vtt(text: str) -> tuple[webvtt.WebVTT, list[str]]:
    try:
        captions = webvtt.from_string(text)
    except webvtt.errors.MalformedFileError as exc:
        raise DocumentError(f"The subtitles cannot be read: {exc}") from None
    return captions, [caption.text for caption in captions]


def write_vtt(captions: webvtt.WebVTT, translations: list[str]) -> str:
    for caption, text in zip(captions, translations, strict=True):
        caption.text = text
    return captions.content


# XLIFF's inline codes (1.2: g x bx ex ph bpt ept it mrk sub; 2.0: pc ph sc ec mrk): the
# text around them is one sentence (service.markup's inline elements).
XLIFF_INLINE = ("g", "x", "bx", "ex", "ph", "bpt", "ept", "it", "mrk", "sub", "pc", "sc", "ec")
# Each kind's inline elements besides HTML's: XLIFF's codes, a DOCX paragraph's runs.
INLINE_TAGS = {"xliff": XLIFF_INLINE, "docx": ("r",), "pptx": ("r",), "odf": ("t",)}
# Attributes a reader is shown or read out as text (an image's description, a tooltip, an
# empty field's hint, a screen reader's label): translated in a
# page, a book or a Markdown file, where text left in the source language would be a gap. An
# HTML fragment sent to the text APIs keeps its attributes as written.
TEXT_ATTRIBUTES = {**dict.fromkeys(("html", "epub"), ("alt", "title", "placeholder",
                                                    "aria-label")),
                   "markdown": ("alt", "title")}
XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"
# A parser that resolves no entity and reads no DTD or network resource.
_XML = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                       huge_tree=False, remove_blank_text=False)


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


def check_zip(data: bytes, what: str) -> None:
    """A zipped office file that can be opened: a zip (an encrypted Office file is not),
    unpacking to a bounded size."""
    if data[:8] == b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1":
        raise DocumentError(f"The {what} is encrypted (password-protected): save it without "
                            "a password.")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile:
        raise DocumentError(f"The {what} is not a valid file (not a zip archive).") from None
    if unpacked > MAX_UNPACKED_BYTES or unpacked > MAX_ZIP_RATIO * max(len(data), 1):
        raise DocumentError(f"The {what} unpacks to {unpacked} bytes from {len(data)}: "
                            "refused as a zip bomb.")


# python-docx has no API for footnotes and endnotes; loaded as XML parts (its documented
# extension point), their paragraphs are read and written as the body's, and saved with it.
_NOTES = (docx.opc.constants.CONTENT_TYPE.WML_FOOTNOTES,
          docx.opc.constants.CONTENT_TYPE.WML_ENDNOTES)
for _content_type in _NOTES:
    docx.opc.part.PartFactory.part_type_for.setdefault(_content_type, docx.opc.part.XmlPart)


@dataclass
class Office:
    """A Word document or a presentation, and the runs of each paragraph translated."""

    document: docx.document.Document | pptx.presentation.Presentation
    runs: list[list]  # each translated paragraph's runs (python-docx's or python-pptx's)


def _docx_paragraphs(document: docx.document.Document) -> Iterator[docx.text.paragraph.Paragraph]:
    """The body's paragraphs, those of its tables' cells (each merged cell once), of the
    sections' headers and footers (each shared one once), and of footnotes and endnotes."""
    yield from document.paragraphs
    seen: set[int] = set()
    for table in document.tables:
        for row in table.rows:
            for cell in row.cells:
                if id(cell._tc) not in seen:
                    seen.add(id(cell._tc))
                    yield from cell.paragraphs
    for section in document.sections:
        for part in (section.header, section.footer):
            if not part.is_linked_to_previous and id(part._element) not in seen:
                seen.add(id(part._element))
                yield from part.paragraphs
    for related in document.part.package.iter_parts():
        if related.content_type in _NOTES and isinstance(related, docx.opc.part.XmlPart):
            for element in related.element.iter(docx.oxml.ns.qn("w:p")):
                yield docx.text.paragraph.Paragraph(element, related)


def read_docx(data: bytes) -> tuple[Office, list[str]]:
    """A Word document and, for each paragraph with text, its runs as one fragment:
    ``<r i="0">...</r><r i="1">...</r>``, so that a paragraph is translated as one text
    and each run (bold, italic, a link's text) gets back the words the model kept inside
    it (``service.markup``)."""
    return _read_office(data, "DOCX", docx.Document, _docx_paragraphs)


def _read_office(data: bytes, what: str, opener: Callable, paragraphs_of: Callable,
                 ) -> tuple[Office, list[str]]:
    check_zip(data, f"{what} file")
    try:
        document = opener(io.BytesIO(data))
    except Exception as exc:  # python-docx and python-pptx raise many kinds for a bad package
        raise DocumentError(f"The {what} file cannot be read: {exc}") from None
    return _office(document, paragraphs_of(document))


def _office(document: docx.document.Document | pptx.presentation.Presentation,
            paragraphs: Iterator) -> tuple[Office, list[str]]:
    runs, texts = [], []
    for paragraph in paragraphs:
        parts = [run for run in paragraph.runs if run.text]
        if not "".join(run.text for run in parts).strip():
            continue
        runs.append(parts)
        texts.append("".join(f'<r i="{i}">{html.escape(run.text, quote=False)}</r>'
                             for i, run in enumerate(parts)))
    return Office(document, runs), texts


def _pptx_paragraphs(presentation: pptx.presentation.Presentation) -> Iterator:
    """Every text frame's paragraphs: in shapes (grouped ones too), table cells and the
    speaker notes, slide by slide."""

    def frames(shapes) -> Iterator:
        for shape in shapes:
            if shape.shape_type == pptx.enum.shapes.MSO_SHAPE_TYPE.GROUP:
                yield from frames(shape.shapes)
            if getattr(shape, "has_text_frame", False) and shape.has_text_frame:
                yield shape.text_frame
            if getattr(shape, "has_table", False) and shape.has_table:
                for row in shape.table.rows:
                    for cell in row.cells:
                        yield cell.text_frame

    for slide in presentation.slides:
        for frame in frames(slide.shapes):
            yield from frame.paragraphs
        if slide.has_notes_slide:
            yield from slide.notes_slide.notes_text_frame.paragraphs


def read_pptx(data: bytes) -> tuple[Office, list[str]]:
    """A presentation and, for each paragraph with text, its runs as one fragment (as
    ``read_docx``)."""
    return _read_office(data, "PPTX", pptx.Presentation, _pptx_paragraphs)


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


def rezip(data: bytes, replaced: dict[str, bytes]) -> bytes:
    """The zip ``data`` with the entries ``replaced`` names changed, the others as they were,
    ``mimetype`` (EPUB's, OpenDocument's) first and stored, as those formats require."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            content = replaced.get(info.filename)
            kind = zipfile.ZIP_STORED if info.filename == "mimetype" else zipfile.ZIP_DEFLATED
            target.writestr(info.filename, source.read(info) if content is None else content,
                            compress_type=kind)
    return out.getvalue()


def epub_text(data: bytes) -> str:
    """An EPUB's words: its content documents' texts without their markup."""
    return "\n".join(segment for chapter in read_epub(data)[1]
                     for segment in markup.parse(chapter, TEXT_ATTRIBUTES["epub"]).segments)


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


_RUN_TAG = re.compile(r'(<r i="\d+">|</r>)')


def write_office(document: Office, translations: list[str]) -> bytes:
    """Each run's text from inside its tag in the translation; words the model left outside
    every tag go to the run before them (or the first)."""
    for runs, translation in zip(document.runs, translations, strict=True):
        texts = [""] * len(runs)
        current, inside = 0, False
        for piece in _RUN_TAG.split(translation):
            if piece.startswith('<r i="'):
                current, inside = int(piece[6:-2]), True
            elif piece == "</r>":
                inside = False
            elif piece:
                texts[current if inside or current < len(runs) else 0] += html.unescape(piece)
        for run, text in zip(runs, texts, strict=True):
            run.text = text
    out = io.BytesIO()
    document.document.save(out)
    return out.getvalue()


def office_text(kind: str, data: bytes) -> str:
    """The words of a binary document (for counting and detection), a paragraph a line."""
    if kind == "epub":
        return epub_text(data)
    if kind == "odf":
        return "\n".join("".join(p.itertext()) for p in read_odf(data)[0].paragraphs)
    document = STRUCTURED[kind][0](data)[0]
    return "\n".join("".join(run.text for run in runs) for runs in document.runs)


# Formats read into texts and written back around their translations.
STRUCTURED = {"po": (read_po, write_po), "srt": (read_srt, write_srt),
              "vtt": (read_vtt, write_vtt), "xliff": (read_xliff, write_xliff),
              "docx": (read_docx, write_office), "pptx": (read_pptx, write_office),
              "epub": (read_epub, write_epub), "odf": (read_odf, write_odf),
              "markdown": (read_markdown, write_markdown)}


@dataclass
class DocumentJob:
    document_id: str
    document_key: str
    owner: str
    filename: str
    kind: str
    media_type: str
    pair: Pair
    characters: int
    status: str = QUEUED
    result: bytes | None = None
    error: str | None = None
    created: float = field(default_factory=time.monotonic)
    finished: float | None = None
    task: asyncio.Task[None] | None = None
    local: bool = True  # run by this process (else read from the shared store)
    published: bool = False  # its record written to the shared store

    def seconds_remaining(self) -> int | None:
        return 0 if self.status == DONE else None


Translate = Callable[[list[str]], Awaitable[list[TextResult]]]


class DocumentJobs:
    """The documents being translated or waiting for their download."""

    def __init__(self, max_jobs: int, ttl_s: float, store: StateStore | None = None,
                 lease_s: float = 30.0) -> None:
        self.max_jobs = max_jobs
        self.ttl_s = ttl_s
        self.store = store
        self.lease_s = lease_s
        self._jobs: dict[str, DocumentJob] = {}
        self._publishing: set[asyncio.Task[None]] = set()

    def expire(self) -> None:
        now = time.monotonic()
        for job in list(self._jobs.values()):
            if job.finished is not None and now - job.finished > self.ttl_s:
                del self._jobs[job.document_id]

    def full(self) -> bool:
        self.expire()
        return len(self._jobs) >= self.max_jobs

    async def start(self, owner: str, filename: str, kind: str, media_type: str, pair: Pair,
                    text: str | bytes, translate: Translate, characters: int) -> DocumentJob:
        """A job for ``text`` (the file's bytes for a binary format), translated by
        ``translate`` (texts in, results out) in the background; with a shared store, its
        record is there before this returns (or, while the store is down, as soon as it
        answers again)."""
        job = DocumentJob(str(uuid.uuid4()).replace("-", "").upper(),
                          secrets.token_hex(32).upper(), owner, filename, kind, media_type,
                          pair, characters)
        self._jobs[job.document_id] = job
        if self.store is not None:
            try:
                await self._publish(job)
            except StoreDown:
                self._publish_later(job)
            self._keep_leased(job)
        job.task = asyncio.get_running_loop().create_task(self._run(job, text, translate))
        return job

    async def _run(self, job: DocumentJob, text: str | bytes, translate: Translate) -> None:
        job.status = TRANSLATING
        try:
            translated: str | bytes
            if job.kind in STRUCTURED:  # read into texts, written back around them
                read, write = STRUCTURED[job.kind]
                # Off the event loop: a large office file takes a good part of a second.
                document, texts = await asyncio.to_thread(read, text)
                results = await translate(texts) if texts else []
                translated = await asyncio.to_thread(
                    write, document, [result.text for result in results])
            elif job.kind == "html":
                assert isinstance(text, str)
                translated = (await translate([text]))[0].text
            else:
                assert isinstance(text, str)
                pieces, separators = paragraphs(text)
                results = await translate(pieces)
                parts = [results[0].text]
                for separator, result in zip(separators, results[1:], strict=True):
                    parts += [separator, result.text]
                translated = "".join(parts)
            # Office files and EPUB are written as bytes, the text formats as text.
            job.result = (translated if isinstance(translated, bytes)
                          else translated.encode("utf-8"))
            job.status = DONE
        except asyncio.CancelledError:
            job.status, job.error = ERROR, "The service stopped before the translation ended."
            raise
        except Exception as exc:  # any failure is the job's answer, not the process's
            job.status, job.error = ERROR, f"Translation failed: {exc}"
        finally:
            job.finished = time.monotonic()
            if self.store is not None:
                self._publish_later(job, at_once=True)

    @staticmethod
    def _name(document_id: str) -> str:
        return f"{PREFIX}document:{document_id}"

    async def _publish(self, job: DocumentJob) -> None:
        """The job's record (and, once done, its file) in the shared store."""
        assert self.store is not None
        record = json.dumps({
            "key": digest(job.document_key), "owner": stored_owner(job.owner),
            "filename": job.filename, "kind": job.kind, "media_type": job.media_type,
            "pair": list(job.pair), "characters": job.characters, "status": job.status,
            "error": job.error})
        # Running: kept as long as a job may run and then be fetched; ended: DOCUMENT_TTL_S.
        ttl = max(1, round(self.ttl_s if job.finished is not None else self.ttl_s + 3600))
        name, result, running = self._name(job.document_id), job.result, job.finished is None

        async def write(r: redis.asyncio.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(name, record, ex=ttl)
                if running:
                    pipe.set(name + ":lease", 1, px=round(self.lease_s * 1000))
                if result is not None:
                    pipe.set(name + ":result", result, ex=ttl)
                await pipe.execute()

        await self.store.run(write)
        job.published = True

    def _keep_leased(self, job: DocumentJob) -> None:
        """The running job's lease renewed every third of ``lease_s`` until it ends; a
        renewal the store misses is tried again a second later."""
        assert self.store is not None
        store, lease = self.store, self._name(job.document_id) + ":lease"

        async def renew() -> None:
            wait = self.lease_s / 3
            while True:
                await asyncio.sleep(wait)
                if job.finished is not None or job.document_id not in self._jobs:
                    return
                try:
                    await store.run(lambda r: r.set(lease, 1, px=round(self.lease_s * 1000)))
                    wait = self.lease_s / 3
                except StoreDown:
                    wait = min(1.0, self.lease_s / 3)

        self._in_background(renew())

    def _in_background(self, work: Coroutine[None, None, None]) -> None:
        """``work`` as a task held until it ends (the loop keeps only weak references)."""
        task = asyncio.get_running_loop().create_task(work)
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    def _publish_later(self, job: DocumentJob, at_once: bool = False) -> None:
        """``_publish`` in the background (now, when ``at_once``), retried each second
        while the store is down, for as long as the job is kept."""

        async def publish() -> None:
            if not at_once:
                await asyncio.sleep(1)
            while job.document_id in self._jobs:
                try:
                    await self._publish(job)
                    return
                except StoreDown:
                    await asyncio.sleep(1)

        self._in_background(publish())

    async def get(self, document_id: str, document_key: str) -> DocumentJob | None:
        """The job, when ``document_key`` is its key: this process's, else (with a shared
        store) another replica's, from its record. StoreDown when only the store could say."""
        self.expire()
        job = self._jobs.get(document_id)
        if job is not None and job.published and job.finished is not None:
            job = await self._not_taken(job)
        if job is None and self.store is not None:
            job = await self._remote(document_id)
        if job is None or not hmac.compare_digest(job.document_key.encode(),
                                                  _key_form(job, document_key).encode()):
            return None
        return job

    async def _not_taken(self, job: DocumentJob) -> DocumentJob | None:
        """This process's finished job, unless another replica's download took it (its
        record is gone from the store); while the store is down, as it is here."""
        assert self.store is not None
        try:
            if await self.store.run(lambda r: r.exists(self._name(job.document_id))):
                return job
        except StoreDown:
            return job
        self._jobs.pop(job.document_id, None)
        return None

    async def _remote(self, document_id: str) -> DocumentJob | None:
        assert self.store is not None
        if not document_id.isalnum():
            return None
        name = self._name(document_id)
        value, leased = await self.store.run(lambda r: r.mget([name, name + ":lease"]))
        if value is None:
            return None
        record = json.loads(value)
        status, error = record["status"], record["error"]
        if status in (QUEUED, TRANSLATING) and leased is None:
            status, error = ERROR, ("The service translating the document stopped before it "
                                    "ended: upload it again.")
        # document_key holds the key's digest: get() compares the digest of the one shown.
        return DocumentJob(document_id, record["key"], record["owner"], record["filename"],
                           record["kind"], record["media_type"], tuple(record["pair"]),
                           record["characters"], status=status, error=error, local=False)

    async def take(self, job: DocumentJob) -> bytes | None:
        """A finished job's translated file, the job deleted with its download (here and in
        the shared store); None when another download took it first."""
        self._jobs.pop(job.document_id, None)
        name = self._name(job.document_id)
        if job.local:
            assert job.result is not None
            if self.store is not None:
                with contextlib.suppress(StoreDown):
                    await self.store.run(lambda r: r.delete(name, name + ":result"))
            return job.result
        assert self.store is not None

        async def take(r: redis.asyncio.Redis) -> list:
            async with r.pipeline(transaction=True) as pipe:
                pipe.get(name + ":result")
                pipe.delete(name, name + ":result")
                return await pipe.execute()

        return (await self.store.run(take))[0]

    async def close(self) -> None:
        tasks = [job.task for job in self._jobs.values() if job.task and not job.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in list(self._publishing):  # the records of jobs just ended, once more
            task.cancel()
        if self.store is not None:
            for job in [job for job in self._jobs.values() if job.finished is not None]:
                with contextlib.suppress(StoreDown):
                    await self._publish(job)


def _key_form(job: DocumentJob, document_key: str) -> str:
    """The key shown, in the form the job holds it: as given for this process's jobs, its
    digest for another replica's."""
    return document_key if job.local else digest(document_key)
