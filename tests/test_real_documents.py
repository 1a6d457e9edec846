"""Real documents (tests/fixtures/documents/real, written by Word, PowerPoint, OpenOffice,
LibreOffice, subtitle tools and gettext's users; origins in SOURCES.md) through all three
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
FILES = sorted(path.name for path in REAL.iterdir() if path.suffix != ".md")
# The text nodes a reader sees, by format, in the XML entries of a zipped document.
W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
DRAW = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"
SHOWN = {".docx": f"{{{W}}}t", ".pptx": f"{{{A}}}t"}
LOWER = re.compile(r"[a-z]")
ADDRESS = re.compile(r"\S+://\S+|\S+@\S+\.\w+")  # kept as written, not translated


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("real-documents")
    env = {"DATA_DIR": str(root / "data"), "API_KEYS": "k1", "MAX_DOCUMENT_CHARS": "500000"}
    with fake_server(root, env=env, step_s=0.0005) as served:
        yield served


def through_deepl(server: ServerProcess, name: str, data: bytes) -> bytes:
    import deepl

    out = io.BytesIO()
    deepl.Translator("k1", server_url=server.url).translate_document(
        data, out, target_lang="DE", filename=name)
    return out.getvalue()


def through_libretranslate(server: ServerProcess, name: str, data: bytes) -> bytes:
    answer = httpx.post(server.url + "/libretranslate/translate_file", timeout=120,
                        data={"source": "en", "target": "de", "api_key": "k1"},
                        files={"file": (name, data)})
    assert answer.status_code == 200, answer.text
    return httpx.get(answer.json()["translatedFileUrl"]).content


def through_native(server: ServerProcess, name: str, data: bytes) -> bytes:
    headers = {"Authorization": "Bearer k1"}
    accepted = httpx.post(server.url + "/translate/document", headers=headers,
                          data={"target_lang": "de", "source_lang": "en"},
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


APIS: dict[str, Callable[[ServerProcess, str, bytes], bytes]] = {
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
    documents byte for byte, each content document well-formed XHTML with its elements."""
    with zipfile.ZipFile(io.BytesIO(source)) as before, \
            zipfile.ZipFile(io.BytesIO(result)) as after:
        assert after.namelist() == before.namelist()
        assert after.infolist()[0].compress_type == zipfile.ZIP_STORED
        texts_before, texts_after = [], []
        for name in before.namelist():
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


@pytest.mark.parametrize("name", FILES)
def test_a_real_document_comes_back_whole_and_translated_through_every_api(
        server: ServerProcess, name: str, tmp_path: Path) -> None:
    source = (REAL / name).read_bytes()
    suffix = Path(name).suffix
    for api, translate in APIS.items():
        result = translate(server, name, source)
        if suffix in (".docx", ".pptx", ".odt"):
            untranslated = judge_zipped(source, result, suffix)
        elif suffix == ".epub":
            untranslated = judge_book(source, result)
        elif suffix in (".srt", ".vtt"):
            untranslated = judge_subtitles(source, result, suffix)
        else:
            untranslated = judge_catalogue(source, result, suffix, tmp_path)
        # What stays lower case: link targets shown as text, a word the fake engine keeps.
        assert untranslated <= 0.02, (api, untranslated)
