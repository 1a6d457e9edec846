"""Real documents (tests/fixtures/documents/real, written by Word, PowerPoint, OpenOffice,
LibreOffice, Docutils, pandoc, Jupytext, Angular, subtitle tools and gettext's users; origins
in SOURCES.md) through all three
document APIs, on FakeEngine bundles (a "translation" is the words upper-cased), each result
judged by opening it with its format's own library: the structure kept, every binary part
byte for byte, and the share of the text translated."""

from __future__ import annotations

import io
import re
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from lxml import etree

from tests.test_server import ServerProcess, fake_server

REAL = Path(__file__).parent / "fixtures" / "documents" / "real"
FILES = sorted(path.name for path in REAL.iterdir() if path.name != "SOURCES.md")
# The text nodes a reader sees, by format, in the XML entries of a zipped document.
W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
DRAW = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"
SHOWN = {".docx": f"{{{W}}}t", ".pptx": f"{{{A}}}t"}
LOWER = re.compile(r"[a-z]")
ADDRESS = re.compile(r"\S+://\S+|\S+@\S+\.\w+")  # kept as written, not translated
# (source, target) of the files not written in English; the others go from English to German.
LANGUAGES = {"ngExtractedMaster1-xliff2.xlf": ("de", "en")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("real-documents")
    env = {"DATA_DIR": str(root / "data"), "API_KEYS": "k1", "MAX_DOCUMENT_CHARS": "500000"}
    with fake_server(root, env=env, step_s=0.0005, pairs=("en-de", "de-en")) as served:
        yield served


def through_deepl(server: ServerProcess, name: str, data: bytes, source: str,
                  target: str) -> bytes:
    import deepl

    out = io.BytesIO()
    deepl.Translator("k1", server_url=server.url).translate_document(
        data, out, source_lang=source.upper(), filename=name,
        target_lang={"en": "EN-US"}.get(target, target.upper()))
    return out.getvalue()


def through_libretranslate(server: ServerProcess, name: str, data: bytes, source: str,
                           target: str) -> bytes:
    answer = httpx.post(server.url + "/libretranslate/translate_file", timeout=120,
                        data={"source": source, "target": target, "api_key": "k1"},
                        files={"file": (name, data)})
    assert answer.status_code == 200, answer.text
    return httpx.get(answer.json()["translatedFileUrl"]).content


def through_native(server: ServerProcess, name: str, data: bytes, source: str,
                   target: str) -> bytes:
    headers = {"Authorization": "Bearer k1"}
    accepted = httpx.post(server.url + "/translate/document", headers=headers,
                          data={"target_lang": target, "source_lang": source},
                          files={"file": (name, data)})
    assert accepted.status_code == 202, accepted.text
    url = f"{server.url}/translate/document/{accepted.json()['document_id']}"
    key = {"document_key": accepted.json()["document_key"]}
    for _ in range(1200):
        status = httpx.get(url, params=key, headers=headers).json()["status"]
        if status in ("done", "error"):
            break
        time.sleep(0.05)
    assert status == "done"
    return httpx.get(url + "/result", params=key, headers=headers).content


APIS: dict[str, Callable[[ServerProcess, str, bytes, str, str], bytes]] = {
    "deepl": through_deepl, "libretranslate": through_libretranslate, "native": through_native}


def left_in_english(before: list[str], after: list[str]) -> float:
    """The share of the source's lower-case letters still lower case: what the fake engine
    did not reach (it upper-cases every word it is given). A number word the service writes
    in German ("Three" as "Drei", which the fake engine left in English) is not counted."""
    from service.number_words import number_values

    def lower(texts: list[str]) -> int:
        return sum(len(LOWER.findall(word)) for text in texts
                   for word in ADDRESS.sub("", text).split() if not number_values(word, "de"))

    return lower(after) / max(lower(before), 1)


def zipped_texts(data: bytes, suffix: str) -> tuple[dict[str, bytes], list[str]]:
    """A zipped document's entries and the texts its reader sees."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        entries = {info.filename: archive.read(info) for info in archive.infolist()}
    texts = []
    for name, content in entries.items():
        if suffix == ".odt" and name in ("content.xml", "styles.xml"):
            root = etree.fromstring(content)
            # A paragraph's own text: not its notes' or frames' (their paragraphs count apart).
            own = etree.XPath("text()|*[not(self::text:note or self::draw:*)]//text()",
                              namespaces={"text": TEXT, "draw": DRAW})
            texts += ["".join(own(p)) for p in root.iter(f"{{{TEXT}}}p", f"{{{TEXT}}}h")
                      if name == "content.xml"
                      or p.xpath("ancestor::*[local-name()='master-styles']")]
        elif suffix != ".odt" and name.endswith(".xml") and not name.startswith(
                ("docProps/", "customXml/", "ppt/slideMasters/", "ppt/slideLayouts/",
                 "ppt/notesMasters/", "ppt/handoutMasters/")):  # masters: prompts, not text
            texts += [node.text or "" for node in etree.fromstring(content).iter(SHOWN[suffix])]
    return entries, texts


def judge_zipped(source: bytes, result: bytes, suffix: str) -> float:
    before, texts_before = zipped_texts(source, suffix)
    after, texts_after = zipped_texts(result, suffix)
    # Every entry; OpenDocument's in order (mimetype first), Office's as python-docx and
    # python-pptx write a package (its parts are found by name, not by place).
    assert (list(after) == list(before)) if suffix == ".odt" else sorted(after) == sorted(before)
    for name, content in before.items():
        if not name.endswith((".xml", ".rels")):
            assert after[name] == content, name  # pictures, thumbnails, fonts: as they were
    if suffix == ".odt":  # a paragraph each (Office's runs may lose their words to others)
        assert len(texts_after) == len(texts_before)
    if suffix == ".docx":
        import docx

        opened, original = docx.Document(io.BytesIO(result)), docx.Document(io.BytesIO(source))
        assert len(opened.paragraphs) == len(original.paragraphs)
        assert len(opened.inline_shapes) == len(original.inline_shapes)
        assert [len(t.rows) for t in opened.tables] == [len(t.rows) for t in original.tables]
    elif suffix == ".pptx":
        import pptx

        opened, original = (pptx.Presentation(io.BytesIO(d)) for d in (result, source))
        assert [len(s.shapes) for s in opened.slides] == [len(s.shapes) for s in original.slides]
    return left_in_english(texts_before, texts_after)


def judge_book(source: bytes, result: bytes) -> float:
    """An EPUB: its entries in order (``mimetype`` first and stored), all but the content
    documents, the package and the table of contents byte for byte, each content document
    well-formed XHTML with its elements; the package's elements all there, only its title and
    description changed."""
    with zipfile.ZipFile(io.BytesIO(source)) as before, \
            zipfile.ZipFile(io.BytesIO(result)) as after:
        assert after.namelist() == before.namelist()
        assert after.infolist()[0].compress_type == zipfile.ZIP_STORED
        texts_before, texts_after = [], []
        for name in before.namelist():
            if name.endswith((".opf", ".ncx")):
                old, new = (etree.fromstring(z.read(name)) for z in (before, after))
                assert [(e.tag, e.attrib) for e in new.iter()] == [
                    (e.tag, e.attrib) for e in old.iter()]
                pairs = list(zip(old.iter(), new.iter(), strict=True))
                labels = [isinstance(o.tag, str) and etree.QName(o).localname in (
                    "title", "description", "text") for o, _ in pairs]
                assert all(o.text == n.text for (o, n), label in zip(pairs, labels, strict=True)
                           if not label)  # the author, identifiers, links as they were
                shown = [(o.text or "", n.text or "") for (o, n), label
                         in zip(pairs, labels, strict=True) if label]
                texts_before += [o for o, _ in shown]
                texts_after += [n for _, n in shown]
                continue
            if not name.endswith(".xhtml"):
                assert after.read(name) == before.read(name), name
                continue
            old, new = (etree.fromstring(z.read(name)) for z in (before, after))
            assert [e.tag for e in new.iter()] == [e.tag for e in old.iter()]
            body = etree.XPath("//*[local-name()='body']//text()")
            texts_before += body(old)
            texts_after += body(new)
    return left_in_english(texts_before, texts_after)


def judge_subtitles(source: bytes, result: bytes, suffix: str) -> float:
    text_before, text_after = source.decode("utf-8"), result.decode("utf-8")
    assert text_after.startswith("\ufeff") == text_before.startswith("\ufeff")
    assert ("\r\n" in text_after) == ("\r\n" in text_before)
    if suffix == ".srt":
        import srt

        before = list(srt.parse(text_before.removeprefix("\ufeff")))
        after = list(srt.parse(text_after.removeprefix("\ufeff")))
        assert [(s.index, s.start, s.end, s.proprietary) for s in after] == [
            (s.index, s.start, s.end, s.proprietary) for s in before]
        return left_in_english([s.content for s in before], [s.content for s in after])
    import webvtt

    before, after = (webvtt.from_buffer(io.StringIO(t)) for t in (text_before, text_after))
    assert [(c.start, c.end, c.identifier, c.voice) for c in after] == [
        (c.start, c.end, c.identifier, c.voice) for c in before]
    # The cue markup (voices, classes, timestamps) exactly as it was, around other words.
    tags = re.compile(r"<[^>]*>")
    assert [tags.findall(c.raw_text) for c in after] == [tags.findall(c.raw_text)
                                                         for c in before]
    return left_in_english([c.text for c in before], [c.text for c in after])


def judge_catalogue(source: bytes, result: bytes, suffix: str, tmp_path: Path) -> float:
    import polib

    before, after = (polib.pofile(d.decode("utf-8")) for d in (source, result))
    assert [(e.msgctxt, e.msgid, e.obsolete) for e in after] == [
        (e.msgctxt, e.msgid, e.obsolete) for e in before]
    for old, new in zip(before, after, strict=True):
        if old.translated() or "fuzzy" in old.flags or old.obsolete:
            assert (new.msgstr, new.msgstr_plural) == (old.msgstr, old.msgstr_plural)
    (tmp_path / "out.po").write_bytes(result)
    checked = subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(tmp_path / "out.po")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    added = [(old.msgid, new.msgstr) for old, new in zip(before, after, strict=True)
             if not old.translated() and new.msgstr and not old.obsolete]
    return left_in_english([m for m, _ in added], [s for _, s in added])


# What a page's reader never sees as words, or sees as written: its text comes back as it was.
KEPT_HTML = {"script", "style", "code", "pre", "kbd", "samp", "var", "math", "svg"}
KEPT_CLASSES = {"math", "literal", "notranslate"}  # pandoc's TeX, Docutils' inline code


ALONE = "ancestor::*[" + " or ".join(
    [*(f"local-name()='{name}'" for name in KEPT_HTML),
     *(f"contains(concat(' ', @class, ' '), ' {name} ')" for name in KEPT_CLASSES)]) + "]"


def judge_page(source: bytes, result: bytes) -> float:
    """An HTML page, parsed with lxml.html: the same elements in the same order with the same
    attributes (but for those a reader sees), MathML and TeX spans (``class="math"``), code and
    scripts as they were."""
    import lxml.html

    before, after = (lxml.html.document_fromstring(d) for d in (source, result))
    old, new = list(before.iter()), list(after.iter())
    assert [e.tag for e in new] == [e.tag for e in old]
    seen = {"alt", "title", "placeholder", "aria-label"}
    texts_before, texts_after = [], []
    for o, n in zip(old, new, strict=True):
        assert {k: v for k, v in n.attrib.items() if k not in seen} == {
            k: v for k, v in o.attrib.items() if k not in seen}
        if not isinstance(o.tag, str):
            continue
        kept = (etree.QName(o).localname in KEPT_HTML
                or KEPT_CLASSES & set(o.get("class", "").split()) or o.xpath(ALONE))
        if kept:
            assert etree.tostring(n, with_tail=False) == etree.tostring(o, with_tail=False)
        elif not o.xpath("ancestor::*[local-name()='head']"):
            texts_before += [o.text or "", *(o.get(a, "") for a in seen)]
            texts_after += [n.text or "", *(n.get(a, "") for a in seen)]
        if o.getparent() is not None and not o.xpath(ALONE) and not o.xpath(
                "ancestor::*[local-name()='head']"):
            texts_before.append(o.tail or "")
            texts_after.append(n.tail or "")
    return left_in_english(texts_before, texts_after)


def _markdown_tokens(text: str) -> list:
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.footnote import footnote_plugin
    from mdit_py_plugins.front_matter import front_matter_plugin

    parser = (MarkdownIt("commonmark").enable(["table", "strikethrough"])
              .use(front_matter_plugin).use(footnote_plugin).use(dollarmath_plugin))
    return parser.parse(text)


def judge_markdown(source: bytes, result: bytes) -> float:
    """A Markdown document, parsed with markdown-it-py: the same blocks in the same order, front
    matter, code, math, link targets and images' sources as they were, pandoc's fenced divs
    (``::: {.cell}``) line for line."""
    text_before, text_after = source.decode("utf-8"), result.decode("utf-8")
    before, after = _markdown_tokens(text_before), _markdown_tokens(text_after)
    assert [(t.type, t.tag) for t in after] == [(t.type, t.tag) for t in before]
    fences = re.compile(r"^:::.*$", re.MULTILINE)
    assert fences.findall(text_after) == fences.findall(text_before)
    texts_before, texts_after = [], []
    for old, new in zip(before, after, strict=True):
        if old.type in ("fence", "code_block", "front_matter", "math_block"):
            assert new.content == old.content
        if old.type != "inline":
            continue
        kept = ("code_inline", "math_inline", "math_inline_double", "footnote_ref")
        assert [(c.type, c.content) for c in new.children if c.type in kept] == [
            (c.type, c.content) for c in old.children if c.type in kept]
        assert [(c.type, c.attrs.get("href"), c.attrs.get("src")) for c in new.children
                if c.type in ("link_open", "image")] == [
            (c.type, c.attrs.get("href"), c.attrs.get("src")) for c in old.children
            if c.type in ("link_open", "image")]
        # A fence's attributes (``{.cell .markdown}``) are not words: checked above.
        texts_before += [fences.sub("", c.content) for c in old.children
                         if c.type in ("text", "image")]
        texts_after += [fences.sub("", c.content) for c in new.children
                        if c.type in ("text", "image")]
    return left_in_english(texts_before, texts_after)


XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"
CODES = ("ph", "bpt", "ept", "it", "sc", "ec", "x", "bx", "ex")  # code, not words


def judge_xliff(source: bytes, result: bytes) -> float:
    """An XLIFF 1.2 or 2.0 file, parsed with lxml: every element but the new targets as it
    was (sources, notes, contexts, existing targets); each source without a translation now
    has a target holding the source's inline codes, attributes and all."""
    before, after = etree.fromstring(source), etree.fromstring(result)
    namespace = etree.QName(before).namespace
    unit = f"{{{namespace}}}{'trans-unit' if namespace == XLIFF_1 else 'segment'}"
    source_tag, target_tag = f"{{{namespace}}}source", f"{{{namespace}}}target"
    old_units, new_units = list(before.iter(unit)), list(after.iter(unit))
    assert len(new_units) == len(old_units) > 0
    texts_before, texts_after = [], []

    def words(element: etree._Element) -> str:
        return "".join(element.xpath(
            "text()|.//*[not(" + " or ".join(f"local-name()='{c}'" for c in CODES)
            + ")]/text()"))

    def codes(element: etree._Element) -> list:
        found = [(etree.QName(e).localname, sorted(e.attrib.items()), e.text)
                 for e in element.iterdescendants() if isinstance(e.tag, str)]
        # A code's content is kept; a paired code's (``pc``, ``g``) is words, translated.
        return sorted((name, attributes, text if name in CODES else None)
                      for name, attributes, text in found)

    for old, new in zip(old_units, new_units, strict=True):
        old_children = [c for c in old if c.tag != target_tag]
        new_children = [c for c in new if c.tag != target_tag]
        assert [etree.tostring(c) for c in new_children] == [etree.tostring(c)
                                                            for c in old_children]
        old_target, new_target = old.find(target_tag), new.find(target_tag)
        if old_target is not None and "".join(old_target.itertext()).strip():
            assert etree.tostring(new_target) == etree.tostring(old_target)
            continue
        assert new_target is not None
        assert codes(new_target) == codes(old.find(source_tag))
        texts_before.append(words(old.find(source_tag)))
        texts_after.append(words(new_target))
    assert texts_before
    return left_in_english(texts_before, texts_after)


@pytest.mark.parametrize("name", FILES)
def test_a_real_document_comes_back_whole_and_translated_through_every_api(
        server: ServerProcess, name: str, tmp_path: Path) -> None:
    source = (REAL / name).read_bytes()
    suffix = Path(name).suffix
    for api, translate in APIS.items():
        result = translate(server, name, source, *LANGUAGES.get(name, ("en", "de")))
        if suffix in (".docx", ".pptx", ".odt"):
            untranslated = judge_zipped(source, result, suffix)
        elif suffix == ".epub":
            untranslated = judge_book(source, result)
        elif suffix in (".srt", ".vtt"):
            untranslated = judge_subtitles(source, result, suffix)
        elif suffix == ".html":
            untranslated = judge_page(source, result)
        elif suffix == ".md":
            untranslated = judge_markdown(source, result)
        elif suffix == ".xlf":
            untranslated = judge_xliff(source, result)
        else:
            untranslated = judge_catalogue(source, result, suffix, tmp_path)
        # What stays lower case: link targets shown as text, a word the fake engine keeps.
        assert untranslated <= 0.02, (api, untranslated)
