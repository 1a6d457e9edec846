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
import pptx
import pptx.enum.shapes
import pptx.opc.package
import pptx.presentation
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
from docx.oxml.text.paragraph import CT_P
from docx.oxml.text.run import CT_R
from lxml import etree

from service.documents.archives import check_zip
from service.documents.errors import DocumentError

# python-docx has no API for footnotes and endnotes; loaded as XML parts (its documented
# extension point), their paragraphs are read and written as the body's, and saved with it.
_NOTES = (docx.opc.constants.CONTENT_TYPE.WML_FOOTNOTES,
          docx.opc.constants.CONTENT_TYPE.WML_ENDNOTES)
for _content_type in _NOTES:
    docx.opc.part.PartFactory.part_type_for.setdefault(_content_type, docx.opc.part.XmlPart)
# The parts of a Word package whose paragraphs a reader sees: the body (of a document, a
# template or their macro-enabled kinds), every header and footer, notes and comments.
_WORD_TEXT = re.compile(r"wordprocessingml\.(document\.main|template\.main|header|footer|"
                        r"footnotes|endnotes|comments)\+xml$|ms-word\.(document|template)"
                        r"\.macroEnabled\.main\+xml$")
_P, _R = qn("w:p"), qn("w:r")
# Charts (their titles, axis titles, series and category names) and SmartArt (its data, and
# the drawing of it Office shows until it lays the diagram out again) hold DrawingML text in
# parts of their own, in Word documents and presentations alike.
_CHART = "application/vnd.openxmlformats-officedocument.drawingml.chart+xml"
_DIAGRAM_DATA = "application/vnd.openxmlformats-officedocument.drawingml.diagramData+xml"
_DIAGRAM_DRAWING = "application/vnd.ms-office.drawingml.diagramDrawing+xml"
_DRAWING_TEXT = (_CHART, _DIAGRAM_DATA, _DIAGRAM_DRAWING)
for _content_type in _DRAWING_TEXT:  # loaded as XML (saved from it), not as bytes
    docx.opc.part.PartFactory.part_type_for.setdefault(_content_type, docx.opc.part.XmlPart)
    pptx.opc.package.PartFactory.part_type_for.setdefault(_content_type,
                                                          pptx.opc.package.XmlPart)
_A_P, _A_R, _A_T = qn("a:p"), qn("a:r"), qn("a:t")
_C_V = qn("c:v")
# A chart's cached strings (a series' name, a category's) sit in these, each one text; its
# numbers (``c:numCache``) are not words.
_CHART_STRINGS = frozenset({qn("c:strCache"), qn("c:strLit"), qn("c:lvl")})
# A run inside these is text a reader no longer sees (a tracked deletion, a move's source):
# kept as it is.
_GONE = frozenset({qn("w:del"), qn("w:moveFrom")})
# A run's children python-docx reads as its text; a page or column break reads as nothing
# and is kept where it is.
_RUN_TEXT = frozenset({qn("w:t"), qn("w:tab"), qn("w:br"), qn("w:cr"),
                       qn("w:noBreakHyphen"), qn("w:ptab")})


@dataclass
class Office:
    """A Word document or a presentation, and the runs of each paragraph translated."""

    document: docx.document.Document | pptx.presentation.Presentation
    runs: list[list]  # each translated paragraph's runs (WordRun or python-pptx's)


class WordRun:
    """A ``w:r`` wherever it sits in its paragraph (in a hyperlink, a tracked insertion, a
    smart tag, a content control, a field's result), its text read and written as
    python-docx reads it, every other child (a picture, a field code, a note's reference, a
    page break) kept in its place."""

    def __init__(self, element: CT_R) -> None:
        self.element = element

    @property
    def text(self) -> str:
        return self.element.text

    @text.setter
    def text(self, text: str) -> None:
        old = [child for child in self.element if child.tag in _RUN_TEXT and str(child)]
        at = self.element.index(old[0]) if old else len(self.element)
        for child in old:
            self.element.remove(child)
        fresh = OxmlElement("w:r")
        fresh.text = text
        for offset, child in enumerate(list(fresh)):
            self.element.insert(at + offset, child)


class DrawingText:
    """A DrawingML run's text (``a:t``) or a chart's cached string (``c:v``)."""

    def __init__(self, element: etree._Element) -> None:
        self.element = element

    @property
    def text(self) -> str:
        return self.element.text or ""

    @text.setter
    def text(self, text: str) -> None:
        self.element.text = text


def _drawing_paragraphs(root: etree._Element) -> Iterator[list[DrawingText]]:
    """A chart's or a SmartArt part's paragraphs (``a:p``: titles, axis titles, a diagram's
    nodes), each its runs' texts, then each cached string of the chart (a series' or a
    category's name) as a paragraph of its own."""
    for paragraph in root.iter(_A_P):
        yield [DrawingText(text) for run in paragraph.iter(_A_R) for text in run.iter(_A_T)]
    for value in root.iter(_C_V):
        holder = value.getparent().getparent()
        if holder is not None and holder.tag in _CHART_STRINGS:
            yield [DrawingText(value)]


def _docx_paragraphs(document: docx.document.Document) -> Iterator[list]:
    """The runs of every paragraph of every part a reader sees: body, tables (each merged
    cell once), content controls, text boxes and shapes (Word's DrawingML and its VML
    fallback alike, each its own paragraph), headers and footers, notes and comments,
    charts and SmartArt."""
    for part in document.part.package.iter_parts():
        if not isinstance(part, docx.opc.part.XmlPart):
            continue
        if part.content_type in _DRAWING_TEXT:
            yield from _drawing_paragraphs(part.element)
        elif _WORD_TEXT.search(part.content_type):
            for paragraph in part.element.iter(_P):
                yield [WordRun(run) for run in paragraph.iter(_R)
                       if _reader_sees(run, paragraph)]


def _reader_sees(run: CT_R, paragraph: CT_P) -> bool:
    """Whether ``run`` is ``paragraph``'s own (not a text box's inside it) and not deleted."""
    for ancestor in run.iterancestors():
        if ancestor is paragraph:
            return True
        if ancestor.tag == _P or ancestor.tag in _GONE:
            return False
    return False


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


# A tab or a line break inside a run, as a tag the markup machinery keeps in its place: as
# whitespace it would reach the model as a space and come back as one.
LAYOUT_TAGS = {"\t": "<tab/>", "\n": "<lb/>"}
_LAYOUT = re.compile("[\t\n]")


def _fragment(text: str) -> str:
    return _LAYOUT.sub(lambda found: LAYOUT_TAGS[found.group()], html.escape(text, quote=False))


def _office(document: docx.document.Document | pptx.presentation.Presentation,
            paragraphs: Iterator) -> tuple[Office, list[str]]:
    runs, texts = [], []
    for paragraph in paragraphs:
        parts = [run for run in paragraph if run.text]
        if not "".join(run.text for run in parts).strip():
            continue
        runs.append(parts)
        texts.append("".join(f'<r i="{i}">{_fragment(run.text)}</r>'
                             for i, run in enumerate(parts)))
    return Office(document, runs), texts


def _pptx_paragraphs(presentation: pptx.presentation.Presentation) -> Iterator:
    """Every text frame's paragraphs: in shapes (grouped ones too), table cells and the
    speaker notes, slide by slide; then the text of every chart and SmartArt diagram."""

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
            for paragraph in frame.paragraphs:
                yield paragraph.runs
        if slide.has_notes_slide:
            for paragraph in slide.notes_slide.notes_text_frame.paragraphs:
                yield paragraph.runs
    for part in presentation.part.package.iter_parts():
        if part.content_type in _DRAWING_TEXT and isinstance(part, pptx.opc.package.XmlPart):
            yield from _drawing_paragraphs(part._element)  # python-pptx names no public one


def read_pptx(data: bytes) -> tuple[Office, list[str]]:
    """A presentation and, for each paragraph with text, its runs as one fragment (as
    ``read_docx``)."""
    return _read_office(data, "PPTX", pptx.Presentation, _pptx_paragraphs)



_RUN_TAG = re.compile(r'(<r i="\d+">|</r>|<tab/>|<lb/>)')
_LAYOUT_TEXT = {tag: char for char, tag in LAYOUT_TAGS.items()}


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
                texts[current if inside or current < len(runs) else 0] += _LAYOUT_TEXT.get(
                    piece) or html.unescape(piece)
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
