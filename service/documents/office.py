"""Word documents (``.docx``, python-docx) and presentations (``.pptx``, python-pptx): each
paragraph one text with its runs as inline tags, so a sentence is translated whole and each
run gets back the words the model kept inside it."""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import docx
import docx.document
import docx.opc.constants
import docx.opc.part
import docx.oxml.ns
import docx.text.paragraph
import docx.text.run
import pptx
import pptx.enum.shapes
import pptx.presentation

from service.documents.archives import check_zip
from service.documents.errors import DocumentError

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




def docx_text(data: bytes) -> str:
    """A Word document's words (for counting and detection), a paragraph a line."""
    return _words(read_docx(data)[0])


def pptx_text(data: bytes) -> str:
    """A presentation's words, a paragraph a line."""
    return _words(read_pptx(data)[0])


def _words(document: Office) -> str:
    return "\n".join("".join(run.text for run in runs) for runs in document.runs)
