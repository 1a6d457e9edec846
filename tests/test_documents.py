"""Documents through all three APIs: DeepL's /v2/document (its official client),
LibreTranslate's /translate_file and the service's own /translate/document, on FakeEngine
bundles (a "translation" is the words upper-cased), and the files refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.documents import DocumentError, document_kind, document_text, paragraphs
from tests.test_server import ServerProcess, fake_server


def test_paragraphs_keep_the_layout() -> None:
    for text in ("one", "one\n\ntwo", "\n\none\n \n\ntwo\n", "", "a\nb\n\n\n\nc"):
        pieces, separators = paragraphs(text)
        joined = [pieces[0]]
        for separator, piece in zip(separators, pieces[1:], strict=True):
            joined += [separator, piece]
        assert "".join(joined) == text
    assert paragraphs("a\nb\n\nc")[0] == ["a\nb", "c"]


def test_files_are_refused_by_name() -> None:
    assert document_kind("Notes.TXT") == ("text", "text/plain; charset=utf-8")
    assert document_kind("page.htm")[0] == "html"
    with pytest.raises(DocumentError, match=r"Invalid file extension '\.pdf'"):
        document_kind("report.pdf")
    with pytest.raises(DocumentError, match="empty"):
        document_text(b"", 100)
    with pytest.raises(DocumentError, match="not UTF-8"):
        document_text("Grüße".encode("latin-1"), 100)
    with pytest.raises(DocumentError, match="MAX_DOCUMENT_CHARS") as raised:
        document_text(b"x" * 101, 100)
    assert raised.value.status == 413
    assert document_text("\ufeffBOM".encode(), 100) == "BOM"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("documents")
    env = {"DATA_DIR": str(root / "data"), "API_KEYS": "k1,k2", "MAX_DOCUMENT_CHARS": "200000"}
    with fake_server(root, env=env, step_s=0.001) as served:
        yield served


def test_deepls_client_translates_text_and_html_files(server: ServerProcess,
                                                      tmp_path: Path) -> None:
    import deepl

    client = deepl.Translator("k1", server_url=server.url)
    text = tmp_path / "notes.txt"
    text.write_text("First line. Second sentence.\nSame paragraph.\n\nNext one\n")
    client.translate_document_from_filepath(text, tmp_path / "out.txt", target_lang="DE")
    assert (tmp_path / "out.txt").read_text() == (
        "FIRST LINE. SECOND SENTENCE.\nSAME PARAGRAPH.\n\nNEXT ONE\n")
    page = tmp_path / "page.html"
    page.write_text('<p>Hello <b>bold</b> <a href="https://x.example" title="Home">world</a>'
                    '<img src="cat.png" alt="A cat"></p><input name="q" value="q" '
                    'placeholder="Search" aria-label="Search the site">')
    client.translate_document_from_filepath(page, tmp_path / "out.html", source_lang="EN",
                                            target_lang="DE")
    # A page's alt text, tooltips, field hints and screen-reader labels are text its readers
    # see or hear: translated too (a field's value is the form's, not the reader's).
    assert (tmp_path / "out.html").read_text() == (
        '<p>HELLO <b>BOLD</b> <a href="https://x.example" title="HOME">WORLD</a>'
        '<img src="cat.png" alt="A CAT"></p><input name="q" value="q" placeholder="SEARCH" '
        'aria-label="SEARCH THE SITE">')
    glossary = client.create_glossary("g", "EN", "DE", {"line": "Zeile"})
    client.translate_document_from_filepath(text, tmp_path / "glossed.txt", source_lang="EN",
                                            target_lang="DE", glossary=glossary)
    assert (tmp_path / "glossed.txt").read_text().startswith("FIRST Zeile.")
    # Counted as translated characters, as text is.
    assert client.get_usage().character.count >= len(text.read_text())
    with pytest.raises(deepl.DeepLException, match=r"Invalid file extension '\.pdf'"):
        client.translate_document(b"%PDF", None, target_lang="DE", filename="a.pdf")
    with pytest.raises(deepl.DeepLException, match="formality"):  # refused, not ignored
        client.translate_document(b"a", None, target_lang="DE", filename="a.txt",
                                  formality="more")
    with pytest.raises(deepl.DeepLException, match="output_format"):
        client.translate_document(b"a", None, target_lang="DE", filename="a.txt",
                                  output_format="docx")
    with pytest.raises(deepl.DeepLException, match="empty"):
        client.translate_document(b"", None, target_lang="DE", filename="a.txt")
    with pytest.raises(deepl.DeepLException, match="not UTF-8"):
        client.translate_document(b"\xff\xfe\xfa", None, target_lang="DE", filename="a.txt")


def test_a_long_document_goes_through_in_pieces(server: ServerProcess, tmp_path: Path) -> None:
    import deepl

    client = deepl.Translator("k1", server_url=server.url)
    text = "\n\n".join(f"Paragraph number {i} here." for i in range(1000))
    source = tmp_path / "long.txt"
    source.write_text(text)
    client.translate_document_from_filepath(source, tmp_path / "long-de.txt", target_lang="DE")
    assert (tmp_path / "long-de.txt").read_text() == text.upper()


def test_libretranslates_translate_file_and_its_download(server: ServerProcess) -> None:
    answer = httpx.post(server.url + "/libretranslate/translate_file", data={
        "source": "en", "target": "de", "api_key": "k1"},
        files={"file": ("hello.txt", b"hello there\n\nagain")})
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    assert url.startswith(server.url + "/libretranslate/download_file/")
    assert url.endswith("/hello.txt")
    first = httpx.get(url)
    assert first.status_code == 200 and first.text == "HELLO THERE\n\nAGAIN"
    assert httpx.get(url).status_code == 404  # downloaded once, then gone
    refused = httpx.post(server.url + "/libretranslate/translate_file", data={
        "source": "en", "target": "de", "api_key": "k1"},
        files={"file": ("a.xlsx", b"PK")})
    assert refused.status_code == 400 and "'.xlsx'" in refused.json()["error"]
    settings = httpx.get(server.url + "/libretranslate/frontend/settings").json()
    assert settings["filesTranslation"] is True and ".txt" in settings["supportedFilesFormat"]


# Each API's document route: how it is sent a file (form fields) and where its answer
# says why a file was refused.
ROUTES: dict[str, tuple[str, dict[str, str], Any]] = {
    "native": ("/translate/document", {"target_lang": "de"},
               lambda answer: answer.json()["error"]["message"]),
    "deepl": ("/v2/document", {"target_lang": "DE", "auth_key": "k1"},
              lambda answer: answer.json()["message"]),
    "libretranslate": ("/libretranslate/translate_file",
                       {"source": "en", "target": "de", "api_key": "k1"},
                       lambda answer: answer.json()["error"]),
}


@pytest.mark.parametrize("api", sorted(ROUTES))
def test_each_api_takes_the_formats_the_registry_gives_it(server: ServerProcess,
                                                          api: str) -> None:
    from service.documents import extensions

    path, fields, reason = ROUTES[api]
    headers = {"Authorization": "Bearer k1"} if api == "native" else {}
    taken = extensions(api)
    assert {".txt", ".docx", ".xlf", ".md", ".epub"} <= set(taken)
    for extension in taken:  # read as the format, never refused for its name
        answer = httpx.post(server.url + path, data=fields, headers=headers,
                            files={"file": (f"notes{extension}", b"Hello there.")})
        assert answer.status_code in (200, 202) or "file extension" not in reason(answer), (
            extension, answer.text)
    for name, named in (("sheet.xlsx", ".xlsx"), ("scan.PDF", ".pdf"), ("notes", "notes")):
        answer = httpx.post(server.url + path, data=fields, headers=headers,
                            files={"file": (name, b"Hello there.")})
        assert answer.status_code == 400, answer.text
        assert reason(answer) == (f"Invalid file extension '{named}': this service translates "
                                  f"{', '.join(taken)}."), answer.text


def test_a_format_the_registry_keeps_from_an_api_is_refused_there(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The registry's ``apis`` decide: a format given to the service's own API alone is taken
    there and refused, naming the format and what is taken, by DeepL's and LibreTranslate's."""
    import dataclasses

    from service.api.uploads import document_request
    from service.documents import BY_EXTENSION, extensions
    from service.pipeline import PipelineError
    from service.settings import Settings

    native_only = dataclasses.replace(BY_EXTENSION[".srt"], apis=frozenset({"native"}))
    monkeypatch.setitem(BY_EXTENSION, ".srt", native_only)
    upload = httpx.Request("POST", "http://service/", data={"target_lang": "de"},
                           files={"file": ("talk.srt", b"1\n00:00:01,000 --> 00:00:02,000\nHi")})
    body, content_type = upload.read(), upload.headers["content-type"]
    settings = Settings(model_dir=tmp_path)
    taken = document_request(body, content_type, settings, api="native", source="source_lang",
                             target="target_lang")
    assert taken.document is not None and taken.document[2] == "srt"
    assert ".srt" in extensions("native") and ".srt" not in extensions("deepl")
    for api, route in (("deepl", "DeepL's /v2/document"),
                       ("libretranslate", "LibreTranslate's /translate_file")):
        with pytest.raises(PipelineError) as refused:
            document_request(body, content_type, settings, api=api, source="source_lang",
                             target="target_lang")
        assert refused.value.code == "invalid_document"
        assert str(refused.value) == (
            f"Invalid file extension '.srt': {route} does not take srt files; it translates "
            f"{', '.join(extensions(api))}.")


def test_an_upload_with_a_wrong_key_is_refused_before_its_file_is_unpacked(
        server: ServerProcess) -> None:
    """The key in an upload's form (LibreTranslate's api_key, DeepL's auth_key) is checked
    before the file is read: a zip bomb with a wrong key gets the key's refusal, not the
    unpacking's, and so costs no memory."""
    import io
    import zipfile

    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"0" * 50_000_000)
    file = {"file": ("a.docx", bomb.getvalue())}
    libre = httpx.post(server.url + "/libretranslate/translate_file", files=file, data={
        "source": "en", "target": "de", "api_key": "wrong"})
    assert libre.status_code in (400, 403) and "key" in libre.json()["error"].lower(), libre.text
    deepl = httpx.post(server.url + "/v2/document", files=file, data={
        "target_lang": "DE", "auth_key": "wrong"})
    assert deepl.status_code == 403, deepl.text
    # With the right key the same file is refused for what it is.
    right = httpx.post(server.url + "/libretranslate/translate_file", files=file, data={
        "source": "en", "target": "de", "api_key": "k1"})
    assert right.status_code == 400 and "zip bomb" in right.json()["error"], right.text


def test_a_libretranslate_file_client(server: ServerProcess, tmp_path: Path) -> None:
    """libretranslate-aio's translate_file, pointed at /libretranslate, and its URL fetched."""
    from libretranslate_aio import LibreTranslate

    page = tmp_path / "page.html"
    page.write_text("<p>Good <i>day</i></p>")
    with LibreTranslate(server.url + "/libretranslate", api_key="k1") as client:
        result = client.translate_file(page, source="en", target="de")
    assert httpx.get(result.translated_file_url).text == "<p>GOOD <i>DAY</i></p>"


def test_the_services_own_document_api(server: ServerProcess) -> None:
    headers = {"Authorization": "Bearer k1"}
    accepted = httpx.post(server.url + "/translate/document", headers=headers,
                          data={"target_lang": "de"},
                          files={"file": ("a.html", b"<h1>Title</h1><p>Text</p>")})
    assert accepted.status_code == 202, accepted.text
    document = accepted.json()
    url = f"{server.url}/translate/document/{document['document_id']}"
    key = {"document_key": document["document_key"]}
    for _ in range(100):
        status = httpx.get(url, params=key, headers=headers).json()
        if status["status"] == "done":
            break
        time.sleep(0.05)
    assert status == {"document_id": document["document_id"], "status": "done",
                      "characters": 25}
    result = httpx.get(url + "/result", params=key, headers=headers)
    assert result.text == "<h1>TITLE</h1><p>TEXT</p>"
    assert result.headers["content-type"].startswith("text/html")
    assert "a.html" in result.headers["content-disposition"]
    assert httpx.get(url + "/result", params=key, headers=headers).status_code == 404
    wrong = httpx.get(url, params={"document_key": "0" * 64}, headers=headers)
    assert wrong.status_code == 404
    unkeyed = httpx.post(server.url + "/translate/document", data={"target_lang": "de"},
                         files={"file": ("a.txt", b"x")})
    assert unkeyed.status_code == 401
    missing = httpx.post(server.url + "/translate/document", headers=headers,
                         files={"file": ("a.txt", b"x")})
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "target_lang"


def test_a_document_is_its_uploaders_alone(server: ServerProcess) -> None:
    """Another key showing the right document_key is told "not found" (404, not 403) by each
    API, status and result alike; the uploader then downloads it. LibreTranslate's keyless
    download URL serves only what /translate_file translated: a document of the other APIs
    cannot be taken through it with its document_key."""
    own, other = {"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}
    native, url, key = uploaded(server, own, "mine.txt", b"secret words")
    for path in ("", "/result"):
        refused = httpx.get(url + path, params=key, headers=other)
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "document_not_found"
    link = (f"{server.url}/libretranslate/download_file/{native['document_id']}/"
            f"{native['document_key']}/mine.txt")
    assert httpx.get(link).status_code == 404
    assert httpx.get(url + "/result", params=key, headers=own).text == "SECRET WORDS"

    deepl = httpx.post(server.url + "/v2/document", headers={
        "Authorization": "DeepL-Auth-Key k1"}, data={"target_lang": "DE"},
        files={"file": ("mine.txt", b"more secret words")}).json()
    status_url = f"{server.url}/v2/document/{deepl['document_id']}"
    key = {"document_key": deepl["document_key"]}
    for path in ("", "/result"):
        refused = httpx.post(status_url + path, data=key,
                             headers={"Authorization": "DeepL-Auth-Key k2"})
        assert refused.status_code == 404, refused.text
        assert refused.json() == {"message": "Document not found"}
        legacy = httpx.post(status_url + path, data={**key, "auth_key": "k2"})
        assert legacy.status_code == 404, legacy.text
    link = (f"{server.url}/libretranslate/download_file/{deepl['document_id']}/"
            f"{deepl['document_key']}/mine.txt")
    assert httpx.get(link).status_code == 404
    assert httpx.post(status_url, data=key, headers={
        "Authorization": "DeepL-Auth-Key k1"}).json()["status"] in ("queued", "translating",
                                                                   "done")


PO = '''# A catalogue of the project.
msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\\n"

#. The window's title
#: src/main.c:10
msgctxt "window"
msgid "Open file"
msgstr ""

#, c-format
msgid "%d file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

msgid "Save"
msgstr "Speichern"

#, fuzzy
msgid "Close"
msgstr "Schliessen"
'''

SRT = '''1
00:00:01,000 --> 00:00:02,500
Hello there.
How are you?

2
00:00:03,000 --> 00:00:04,000
Fine.
'''


XLIFF = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file source-language="en" target-language="de" datatype="plaintext" original="ui">
    <body>
      <trans-unit id="1">
        <source>Click <g id="b">Save</g> to keep &amp; close<x id="2"/>.</source>
      </trans-unit>
      <trans-unit id="2">
        <source>Done</source>
        <target state="translated">Fertig</target>
      </trans-unit>
    </body>
  </file>
</xliff>
"""
XLIFF_2 = """<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en">
<file id="f"><unit id="u"><segment><source>Press <pc id="1">OK</pc> now.</source></segment>
</unit></file></xliff>"""
LAUGHS = """<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "ha"><!ENTITY b "&a;&a;&a;">]>
<xliff xmlns="urn:oasis:names:tc:xliff:document:1.2"><file><body><trans-unit id="1">
<source>&b;</source></trans-unit></body></file></xliff>"""


def uploaded(server: ServerProcess, headers: dict[str, str], name: str,
             content: bytes) -> tuple[dict[str, Any], str, dict[str, str]]:
    """A document uploaded to the service's own document API and waited for: what the upload
    answered, the document's URL and its document_key parameter."""
    accepted = httpx.post(server.url + "/translate/document", headers=headers,
                          data={"target_lang": "de"}, files={"file": (name, content)}).json()
    url = f"{server.url}/translate/document/{accepted['document_id']}"
    key = {"document_key": accepted["document_key"]}
    for _ in range(200):
        if httpx.get(url, params=key, headers=headers).json()["status"] == "done":
            break
        time.sleep(0.05)
    return accepted, url, key


def translated_file(server: ServerProcess, name: str, content: str) -> str:
    """A document translated through the service's own document API."""
    headers = {"Authorization": "Bearer k1"}
    _, url, key = uploaded(server, headers, name, content.encode())
    return httpx.get(url + "/result", params=key, headers=headers).text


def test_catalogues_and_subtitles_keep_their_structure(server: ServerProcess) -> None:
    import polib
    import srt

    headers = {"Authorization": "Bearer k1"}

    def translated(name: str, content: str) -> str:
        return translated_file(server, name, content)

    catalogue = polib.pofile(translated("app.po", PO))
    assert catalogue.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    opened = catalogue.find("Open file", msgctxt="window")
    assert opened.msgstr == "OPEN FILE" and "fuzzy" in opened.flags
    assert opened.comment == "The window's title" and opened.occurrences == [("src/main.c",
                                                                              "10")]
    files = catalogue.find("%d file")
    assert files.msgstr_plural == {0: "%d FILE", 1: "%d FILES"}
    assert "c-format" in files.flags and "fuzzy" in files.flags
    assert catalogue.find("Save").msgstr == "Speichern"  # already translated: kept
    assert catalogue.find("Close").msgstr == "Schliessen"  # fuzzy: a human's, kept
    subtitles = list(srt.parse(translated("film.srt", SRT)))
    assert [(s.index, s.start.total_seconds(), s.end.total_seconds(), s.content)
            for s in subtitles] == [(1, 1.0, 2.5, "HELLO THERE.\nHOW ARE YOU?"),
                                    (2, 3.0, 4.0, "FINE.")]
    cues = translated("film.vtt", "WEBVTT\n\nintro\n00:00:01.000 --> 00:00:02.000 "
                      "align:start\nHello.\n\nNOTE kept\n\n00:00:03.000 --> 00:00:04.000\n"
                      "Bye now.\n")
    assert cues == ("WEBVTT\n\nintro\n00:00:01.000 --> 00:00:02.000 align:start\nHELLO.\n\n"
                    "NOTE kept\n\n00:00:03.000 --> 00:00:04.000\nBYE NOW.\n")
    xliff = translated("ui.xlf", XLIFF)
    assert '<target state="needs-review-translation">CLICK <g id="b">SAVE</g> TO KEEP ' \
           '&amp; CLOSE<x id="2"/>.</target>' in xliff
    assert '<target state="translated">Fertig</target>' in xliff  # a translation kept
    assert xliff.startswith("<?xml version='1.0' encoding='UTF-8'?>")
    two = translated("ui.xliff", XLIFF_2)
    assert '<segment state="translated"><source>Press <pc id="1">OK</pc> now.</source>' \
           '<target>PRESS <pc id="1">OK</pc> NOW.</target></segment>' in two
    for name, content, why in (
            ("laughs.xlf", LAUGHS, "DTD or entity"), ("bad.xlf", "<xliff", "cannot be read"),
            ("other.xlf", "<root/>", "Not an XLIFF")):
        refused = httpx.post(server.url + "/translate/document", headers=headers,
                             data={"target_lang": "de"}, files={"file": (name, content)})
        assert refused.status_code == 400 and why in refused.json()["error"]["message"]
    broken = httpx.post(server.url + "/translate/document", headers=headers,
                        data={"target_lang": "de"},
                        files={"file": ("bad.srt", b"1\nnot a time\nHello\n")})
    assert broken.status_code == 400 and "subtitles cannot be read" in broken.json()[
        "error"]["message"]


def translated_bytes(server: ServerProcess, name: str, content: bytes) -> bytes:
    """A document translated through DeepL's document API, as the bytes downloaded."""
    import io

    import deepl

    client, out = deepl.Translator("k1", server_url=server.url), io.BytesIO()
    client.translate_document(content, out, target_lang="DE", filename=name)
    return out.getvalue()


def test_subtitle_markup_numbering_bom_and_line_ends_kept(server: ServerProcess) -> None:
    import srt
    import webvtt

    # A Teams transcript's speakers, a class span, italics and a karaoke timestamp.
    vtt = ("WEBVTT\n\n00:00:01.000 --> 00:00:04.000 align:start\n<v Roger Bingham>We are "
           "in <c.yellow>New York</c> <00:00:02.500>city\n<i>right now</i> &amp; here.\n\n"
           "00:00:05.000 --> 00:00:06.000\n<v.loud Ann>Bye.</v>\n")
    out = translated_bytes(server, "talk.vtt", vtt.encode()).decode()
    assert out == ("WEBVTT\n\n00:00:01.000 --> 00:00:04.000 align:start\n<v Roger Bingham>WE "
                   "ARE IN <c.yellow>NEW YORK</c> <00:00:02.500>CITY\n<i>RIGHT NOW</i> &amp; "
                   "HERE.\n\n00:00:05.000 --> 00:00:06.000\n<v.loud Ann>BYE.</v>\n")
    captions = webvtt.from_string(out)
    assert [caption.voice for caption in captions] == ["Roger Bingham", "Ann"]
    # SubRip from a Windows subtitle editor: a BOM, CRLF, a font attribute, cues unnumbered.
    source = ("\ufeff00:00:01,000 --> 00:00:02,500\r\nHello <font face=\"Arial\" "
              "color=\"#ffff00\">there</font>,\r\n{\\an8}my friend.\r\n\r\n"
              "00:00:03,000 --> 00:00:04,000\r\n<i>Fine.</i>\r\n\r\n")
    out = translated_bytes(server, "film.srt", source.encode()).decode("utf-8")
    assert out == ("\ufeff00:00:01,000 --> 00:00:02,500\r\nHELLO <font face=\"Arial\" "
                   "color=\"#ffff00\">THERE</font>,\r\n{\\an8}MY FRIEND.\r\n\r\n"
                   "00:00:03,000 --> 00:00:04,000\r\n<i>FINE.</i>\r\n\r\n")
    subtitles = list(srt.parse(out.removeprefix("\ufeff")))
    assert [(s.index, s.start.total_seconds()) for s in subtitles] == [(None, 1.0), (None, 3.0)]


ASCII_PO = """msgid ""
msgstr ""
"Project-Id-Version: app 1.0\\n"
"Content-Type: text/plain; charset=ASCII\\n"
"Content-Transfer-Encoding: 8bit\\n"
"Language: de\\n"

#: src/main.c:12
msgid "Quit the application"
msgstr ""
"""


def test_a_catalogue_declaring_ascii_is_written_as_utf8(server: ServerProcess,
                                                        tmp_path: Path) -> None:
    import subprocess

    import polib

    out = translated_bytes(server, "app.po", ASCII_PO.encode()).replace(
        b"QUIT THE APPLICATION", "Anwendung beenden (ä)".encode())  # German, not ASCII
    catalogue = polib.pofile(out.decode("utf-8"))
    assert catalogue.metadata["Content-Type"] == "text/plain; charset=UTF-8"
    assert catalogue.find("Quit the application").msgstr == "Anwendung beenden (ä)"
    (tmp_path / "app.po").write_bytes(out)
    # Compiled with the fuzzy translations (this service marks its own fuzzy for review).
    checked = subprocess.run(["msgfmt", "--check", "--use-fuzzy", "-o", str(tmp_path / "app.mo"),
                              str(tmp_path / "app.po")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert polib.mofile(str(tmp_path / "app.mo")).find("Quit the application").msgstr == (
        "Anwendung beenden (ä)")


def word_document(path: Path) -> Path:
    import docx

    document = docx.Document()
    paragraph = document.add_paragraph("Click ")
    paragraph.add_run("Save").bold = True
    paragraph.add_run(" to keep the file.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "First cell."
    table.cell(0, 1).text = "Second cell."
    document.sections[0].header.paragraphs[0].text = "Header text."
    document.save(path)
    with_footnote(path, "A note at the foot.")
    return path


W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def with_footnote(path: Path, note: str) -> None:
    """A footnote added to a DOCX as Word writes one (python-docx cannot): the footnotes
    part, its relationship and content type, and a reference in the first paragraph."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    parts["word/footnotes.xml"] = (
        f'<w:footnotes xmlns:w="{W}"><w:footnote w:type="separator" w:id="-1"><w:p><w:r>'
        f'<w:separator/></w:r></w:p></w:footnote><w:footnote w:id="1"><w:p><w:r><w:t>{note}'
        "</w:t></w:r></w:p></w:footnote></w:footnotes>").encode()
    parts["word/_rels/document.xml.rels"] = parts["word/_rels/document.xml.rels"].replace(
        b"</Relationships>", b'<Relationship Id="rIdNotes" Type="http://schemas.openxmlformats'
        b'.org/officeDocument/2006/relationships/footnotes" Target="footnotes.xml"/>'
        b"</Relationships>")
    parts["[Content_Types].xml"] = parts["[Content_Types].xml"].replace(
        b"</Types>", b'<Override PartName="/word/footnotes.xml" ContentType="application/vnd.'
        b'openxmlformats-officedocument.wordprocessingml.footnotes+xml"/></Types>')
    parts["word/document.xml"] = parts["word/document.xml"].replace(
        b"</w:p>", b'<w:r><w:footnoteReference w:id="1"/></w:r></w:p>', 1)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)


def test_word_documents_keep_runs_tables_and_headers(server: ServerProcess,
                                                     tmp_path: Path) -> None:
    import io
    import zipfile

    import deepl
    import docx

    client = deepl.Translator("k1", server_url=server.url)
    source = word_document(tmp_path / "report.docx")
    client.translate_document_from_filepath(source, tmp_path / "report.de.docx",
                                            target_lang="DE")
    translated = docx.Document(tmp_path / "report.de.docx")
    runs = [(run.text, run.bold) for run in translated.paragraphs[0].runs if run.text]
    assert runs == [("CLICK ", None), ("SAVE", True), (" TO KEEP THE FILE.", None)]
    assert [c.text for c in translated.tables[0].rows[0].cells] == ["FIRST CELL.",
                                                                    "SECOND CELL."]
    assert translated.sections[0].header.paragraphs[0].text == "HEADER TEXT."
    with zipfile.ZipFile(tmp_path / "report.de.docx") as archive:
        notes = archive.read("word/footnotes.xml").decode()
        assert "A NOTE AT THE FOOT." in notes and "<w:separator/>" in notes
        assert 'w:footnoteReference w:id="1"' in archive.read("word/document.xml").decode()
    # Refused by name: an encrypted file (an OLE container), a corrupt zip, a zip bomb.
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"0" * 50_000_000)
    for content, why in ((b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 100, "encrypted"),
                         (b"PK\x03\x04 broken", "not a valid file"),
                         (bomb.getvalue(), "zip bomb")):
        with pytest.raises(deepl.DeepLException, match=why):
            client.translate_document(content, None, target_lang="DE", filename="a.docx")


# Paragraphs as Word writes them where python-docx's ``Paragraph.runs`` does not look: a
# hyperlink, a tracked insertion beside a deletion, a smart tag, an inline and a block content
# control, a field (its code kept, its result translated), a text box in DrawingML with its
# VML fallback, and a lone period in a run of its own.
WORD_HIDDEN_RUNS = (
    '<w:p><w:r><w:t xml:space="preserve">An external link in </w:t></w:r><w:hyperlink '
    'r:id="rIdLink"><w:r><w:rPr><w:rStyle w:val="Hyperlink"/></w:rPr><w:t>a popular site'
    '</w:t></w:r></w:hyperlink><w:r><w:t>.</w:t></w:r></w:p>'
    '<w:p><w:r><w:t xml:space="preserve">Words </w:t></w:r><w:ins w:id="1" w:author="A" '
    'w:date="2024-01-01T00:00:00Z"><w:r><w:t xml:space="preserve">added here </w:t></w:r>'
    '</w:ins><w:del w:id="2" w:author="A" w:date="2024-01-01T00:00:00Z"><w:r><w:delText>'
    'removed there </w:delText></w:r></w:del><w:r><w:t>stay</w:t><w:tab/><w:t>put</w:t><w:br/>'
    '<w:t>here.</w:t></w:r></w:p>'
    '<w:p><w:smartTag w:uri="urn:schemas-microsoft-com:office:smarttags" w:element="place">'
    '<w:r><w:t>London</w:t></w:r></w:smartTag><w:r><w:t xml:space="preserve"> is </w:t></w:r>'
    '<w:sdt><w:sdtPr><w:alias w:val="Size"/></w:sdtPr><w:sdtContent><w:r><w:t>very large'
    '</w:t></w:r></w:sdtContent></w:sdt><w:r><w:t xml:space="preserve"> on page </w:t></w:r>'
    '<w:fldSimple w:instr=" PAGE "><w:r><w:t>1</w:t></w:r></w:fldSimple><w:r>'
    '<w:t xml:space="preserve"> as of </w:t></w:r><w:r>'
    '<w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText xml:space="preserve"> DATE '
    '</w:instrText></w:r><w:r><w:fldChar w:fldCharType="separate"/></w:r><w:r><w:t>today'
    '</w:t></w:r><w:r><w:fldChar w:fldCharType="end"/></w:r><w:r><w:t>.</w:t></w:r></w:p>'
    '<w:sdt><w:sdtPr><w:alias w:val="Block"/></w:sdtPr><w:sdtContent><w:p><w:r><w:t>A block '
    'control holds this.</w:t></w:r></w:p></w:sdtContent></w:sdt>'
    '<w:p><w:r><w:t xml:space="preserve">Before the box </w:t></w:r><w:r><mc:AlternateContent>'
    '<mc:Choice Requires="wps"><w:drawing><wp:anchor><a:graphic><a:graphicData uri="http://'
    'schemas.microsoft.com/office/word/2010/wordprocessingShape"><wps:wsp><wps:txbx>'
    '<w:txbxContent><w:p><w:r><w:t>Text in a box.</w:t></w:r></w:p></w:txbxContent>'
    '</wps:txbx></wps:wsp></a:graphicData></a:graphic></wp:anchor></w:drawing></mc:Choice>'
    '<mc:Fallback><w:pict><v:shape><v:textbox><w:txbxContent><w:p><w:r><w:t>Text in a box.'
    '</w:t></w:r></w:p></w:txbxContent></v:textbox></v:shape></w:pict></mc:Fallback>'
    '</mc:AlternateContent></w:r><w:r><w:t>and after it.</w:t></w:r></w:p>')


def test_word_text_in_links_insertions_controls_fields_boxes_and_comments(
        server: ServerProcess, tmp_path: Path) -> None:
    import zipfile

    import deepl
    import docx
    from lxml import etree

    document = docx.Document()
    commented = document.add_paragraph("Commented words.")
    document.add_comment(commented.runs, text="Check this sentence.", author="Reviewer")
    source = tmp_path / "hidden.docx"
    document.save(source)
    with zipfile.ZipFile(source) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    body = parts["word/document.xml"].decode()  # its root declares wps, wp, mc, v, r
    body = body.replace("<w:document ", '<w:document xmlns:a="http://schemas.openxmlformats.'
                        'org/drawingml/2006/main" ', 1)
    parts["word/document.xml"] = body.replace("<w:body>", "<w:body>" + WORD_HIDDEN_RUNS,
                                              1).encode()
    parts["word/_rels/document.xml.rels"] = parts["word/_rels/document.xml.rels"].replace(
        b"</Relationships>", b'<Relationship Id="rIdLink" Type="http://schemas.openxmlformats.'
        b'org/officeDocument/2006/relationships/hyperlink" Target="https://example.com" '
        b'TargetMode="External"/></Relationships>')
    with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    client = deepl.Translator("k1", server_url=server.url)
    client.translate_document_from_filepath(source, tmp_path / "hidden.de.docx",
                                            target_lang="DE")
    translated = docx.Document(tmp_path / "hidden.de.docx")
    def xpath(element: etree._Element, path: str) -> list:
        return etree.XPath(path, namespaces={"w": W})(element)

    def texts(element: etree._Element, path: str) -> list[str]:
        """Each node's text as Word shows it with its changes marked: its w:t and w:delText,
        in order (python-docx's elements redefine lxml's itertext)."""
        return ["".join(xpath(node, ".//w:t/text() | .//w:delText/text()"))
                for node in xpath(element, path)]

    body_element = translated.element.body
    paragraphs = texts(body_element, "./w:p | ./w:sdt/w:sdtContent/w:p")
    assert paragraphs[0] == "AN EXTERNAL LINK IN A POPULAR SITE."
    # The insertion translated with its sentence, the deletion kept as it was.
    assert paragraphs[1] == "WORDS ADDED HERE removed there STAYPUTHERE."  # a tab, a break
    assert [etree.QName(child).localname for child in xpath(body_element, "./w:p[2]/w:r")[-1]
            ] == ["t", "tab", "t", "br", "t"]
    assert texts(body_element, ".//w:del") == ["removed there "]
    assert paragraphs[2] == "LONDON IS VERY LARGE ON PAGE 1 AS OF TODAY."
    assert [node.text for node in xpath(body_element, ".//w:instrText")] == [" DATE "]
    assert paragraphs[3] == "A BLOCK CONTROL HOLDS THIS."
    assert texts(body_element, ".//w:txbxContent/w:p") == ["TEXT IN A BOX."] * 2
    assert paragraphs[4].startswith("BEFORE THE BOX ") and paragraphs[4].endswith(
        "AND AFTER IT.")
    assert translated.paragraphs[-1].text == "COMMENTED WORDS."
    assert [c.text for c in translated.comments] == ["CHECK THIS SENTENCE."]
    link = xpath(body_element, ".//w:hyperlink")[0]
    assert link.get(docx.oxml.ns.qn("r:id")) == "rIdLink"


def zip_by_hand(entries: list[tuple[str, bytes, int, int]]) -> bytes:
    """A zip written byte by byte: each entry (name, deflated data, CRC-32, the inflated size
    its headers declare), so that a header can say what its data is not."""
    import struct

    body, directory = b"", b""
    for name, packed, crc, declared in entries:
        fields = (20, 0, 8, 0, 0, crc, len(packed), declared, len(name.encode()), 0)
        directory += struct.pack("<4s2H" + "4H3L3H2HLL", b"PK\x01\x02", 20, *fields, 0, 0,
                                 0, 0, len(body)) + name.encode()
        body += struct.pack("<4sH" + "4H3L2H", b"PK\x03\x04", *fields) + name.encode() + packed
    return body + directory + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries),
                                          len(entries), len(directory), len(body), 0)


def deflated(chunks: Iterator[bytes]) -> tuple[bytes, int, int]:
    """Raw deflate data of the chunks, their CRC-32 and their size, a chunk at a time."""
    import zlib

    packer, crc, size, packed = zlib.compressobj(9, zlib.DEFLATED, -15), 0, 0, []
    for chunk in chunks:
        crc, size = zlib.crc32(chunk, crc), size + len(chunk)
        packed.append(packer.compress(chunk))
    return b"".join(packed) + packer.flush(), crc, size


def lying_docx(tmp_path: Path) -> bytes:
    """A real Word document with one more entry: 256 MB of zeros (a quarter of a megabyte
    deflated) whose headers say it holds 1,000 bytes."""
    import zipfile

    source = word_document(tmp_path / "honest.docx")
    entries = []
    with zipfile.ZipFile(source) as archive:
        for info in archive.infolist():
            entries.append((info.filename, *deflated(iter([archive.read(info)]))))
    packed, crc, _ = deflated(bytes(1 << 20) for _ in range(256))
    entries.append(("word/media/image1.png", packed, crc, 1000))
    return zip_by_hand(entries)


def test_a_zip_entry_lying_about_its_size_is_refused_within_bounded_memory(
        server: ServerProcess, tmp_path: Path) -> None:
    import tracemalloc

    import deepl

    from service.documents.archives import check_zip

    lying = lying_docx(tmp_path)
    assert len(lying) < 1_500_000
    tracemalloc.start()
    try:
        with pytest.raises(DocumentError, match="more than the 1000 bytes its header declares"):
            check_zip(lying, "DOCX file")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(lying)  # the upload and a copy of one entry, never its inflation
    # Honest headers pass (the document the liar was made from), and the API says why not.
    honest = word_document(tmp_path / "again.docx").read_bytes()
    check_zip(honest, "DOCX file")
    client = deepl.Translator("k1", server_url=server.url)
    with pytest.raises(deepl.DeepLException, match="its header declares"):
        client.translate_document(lying, None, target_lang="DE", filename="a.docx")
    for name in ("empty.docx", "empty.odt", "empty.epub", "empty.pptx"):
        with pytest.raises(deepl.DeepLException, match=r"is empty \(0 bytes\)"):
            client.translate_document(b"", None, target_lang="DE", filename=name)


def test_presentations_keep_runs_tables_and_notes(server: ServerProcess, tmp_path: Path) -> None:
    import deepl
    import pptx
    from pptx.util import Inches

    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[5])
    slide.shapes.title.text = "Slide title"
    box = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(4), Inches(1))
    paragraph = box.text_frame.paragraphs[0]
    paragraph.text = "Press "
    bold = paragraph.add_run()
    bold.text, bold.font.bold = "Enter", True
    table = slide.shapes.add_table(1, 1, Inches(1), Inches(4), Inches(2), Inches(1)).table
    table.cell(0, 0).text = "In a cell."
    slide.notes_slide.notes_text_frame.text = "Speaker notes."
    source = tmp_path / "deck.pptx"
    presentation.save(source)
    client = deepl.Translator("k1", server_url=server.url)
    client.translate_document_from_filepath(source, tmp_path / "deck.de.pptx", target_lang="DE")
    translated = pptx.Presentation(tmp_path / "deck.de.pptx").slides[0]
    assert translated.shapes.title.text == "SLIDE TITLE"
    runs = [(r.text, r.font.bold) for r in translated.shapes[1].text_frame.paragraphs[0].runs]
    assert runs == [("PRESS ", None), ("ENTER", True)]
    assert translated.shapes[2].table.cell(0, 0).text == "IN A CELL."
    assert translated.notes_slide.notes_text_frame.text == "SPEAKER NOTES."


# A SmartArt diagram as Office writes its parts: the data (each node's text) and the drawing
# Office shows of it until it lays the diagram out again.
DIAGRAM_DATA = (
    '<dgm:dataModel xmlns:dgm="http://schemas.openxmlformats.org/drawingml/2006/diagram" '
    'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><dgm:ptLst>'
    '<dgm:pt modelId="{0}" type="doc"><dgm:prSet/><dgm:spPr/><dgm:t><a:bodyPr/><a:p>'
    '<a:endParaRPr lang="en-US"/></a:p></dgm:t></dgm:pt><dgm:pt modelId="{1}"><dgm:prSet '
    'phldrT="[Text]"/><dgm:spPr/><dgm:t><a:bodyPr/><a:p><a:r><a:rPr lang="en-US" b="1"/>'
    '<a:t>Plan </a:t></a:r><a:r><a:rPr lang="en-US"/><a:t>the work</a:t></a:r></a:p></dgm:t>'
    '</dgm:pt></dgm:ptLst><dgm:cxnLst><dgm:cxn modelId="{2}" srcId="{0}" destId="{1}"/>'
    '</dgm:cxnLst></dgm:dataModel>')
DIAGRAM_DRAWING = (
    '<dsp:drawing xmlns:dsp="http://schemas.microsoft.com/office/drawing/2008/diagram" '
    'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><dsp:spTree><dsp:sp '
    'modelId="{3}"><dsp:txBody><a:bodyPr/><a:p><a:r><a:rPr lang="en-US" b="1"/><a:t>Plan </a:t>'
    '</a:r><a:r><a:rPr lang="en-US"/><a:t>the work</a:t></a:r></a:p></dsp:txBody></dsp:sp>'
    '</dsp:spTree></dsp:drawing>')
DIAGRAM_TYPES = {"data": "application/vnd.openxmlformats-officedocument.drawingml.diagramData+xml",
                 "drawing": "application/vnd.ms-office.drawingml.diagramDrawing+xml"}
DIAGRAM_RELATIONS = {
    "data": "http://schemas.openxmlformats.org/officeDocument/2006/relationships/diagramData",
    "drawing": "http://schemas.microsoft.com/office/2007/relationships/diagramDrawing"}


def chart_presentation() -> Any:
    """A presentation with a chart (a title, axis titles, two categories, a series) written by
    python-pptx, and a SmartArt diagram's parts related from its slide."""
    import pptx
    from pptx.chart.data import CategoryChartData
    from pptx.enum.chart import XL_CHART_TYPE
    from pptx.opc.package import Part
    from pptx.opc.packuri import PackURI
    from pptx.util import Inches

    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[6])
    data = CategoryChartData()
    data.categories = ["North coast", "South coast"]
    data.add_series("Last year", (12.5, 7))
    chart = slide.shapes.add_chart(XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(1), Inches(1),
                                   Inches(6), Inches(4), data).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = "Sales by region"
    chart.category_axis.axis_title.text_frame.text = "Region"
    chart.value_axis.axis_title.text_frame.text = "Units sold"
    for kind, xml in (("data", DIAGRAM_DATA), ("drawing", DIAGRAM_DRAWING)):
        part = Part(PackURI(f"/ppt/diagrams/{kind}1.xml"), DIAGRAM_TYPES[kind],
                    slide.part.package, xml.encode())
        slide.part.relate_to(part, DIAGRAM_RELATIONS[kind])
    return presentation


def drawing_texts(root: Any) -> list[str]:
    """A chart's or a diagram's paragraphs and cached strings, as a reader sees them."""
    a, c = ("{http://schemas.openxmlformats.org/drawingml/2006/" + n + "}" for n in ("main",
                                                                                   "chart"))
    paragraphs = ["".join(t.text for t in p.iter(f"{a}t")) for p in root.iter(f"{a}p")]
    return [p for p in paragraphs if p] + [v.text for v in root.iter(f"{c}v")]


def test_charts_and_smartart_are_translated(server: ServerProcess, tmp_path: Path) -> None:
    import zipfile

    import deepl
    import docx
    from docx.opc.constants import RELATIONSHIP_TYPE
    from docx.opc.packuri import PackURI
    from docx.opc.part import Part
    from lxml import etree

    presentation = chart_presentation()
    presentation.save(tmp_path / "deck.pptx")
    # The same chart and diagram in a Word document (python-docx writes no charts: the
    # chart part is python-pptx's).
    chart_part = presentation.slides[0].shapes[0].chart_part
    document = docx.Document()
    document.add_paragraph("Our sales.")
    document.part.relate_to(Part(PackURI("/word/charts/chart1.xml"), chart_part.content_type,
                                 chart_part.blob, document.part.package), RELATIONSHIP_TYPE.CHART)
    for kind, xml in (("data", DIAGRAM_DATA), ("drawing", DIAGRAM_DRAWING)):
        document.part.relate_to(Part(PackURI(f"/word/diagrams/{kind}1.xml"), DIAGRAM_TYPES[kind],
                                     xml.encode(), document.part.package),
                                DIAGRAM_RELATIONS[kind])
    document.save(tmp_path / "report.docx")
    client = deepl.Translator("k1", server_url=server.url)
    for name, folder in (("deck.pptx", "ppt"), ("report.docx", "word")):
        client.translate_document_from_filepath(tmp_path / name, tmp_path / f"de-{name}",
                                                target_lang="DE")
        with zipfile.ZipFile(tmp_path / name) as before, \
                zipfile.ZipFile(tmp_path / f"de-{name}") as after:
            chart = next(n for n in before.namelist() if n.startswith(f"{folder}/charts/chart"))
            old, new = (etree.fromstring(z.read(chart)) for z in (before, after))
            assert drawing_texts(old) == [
                "Sales by region", "Region", "Units sold", "Last year", "North coast",
                "South coast", "12.5", "7"]
            assert drawing_texts(new) == [
                "SALES BY REGION", "REGION", "UNITS SOLD", "LAST YEAR", "NORTH COAST",
                "SOUTH COAST", "12.5", "7"]
            embedded = [n for n in before.namelist() if n.endswith(".xlsx")]
            assert [after.read(n) for n in embedded] == [before.read(n) for n in embedded]
            for kind in ("data", "drawing"):
                diagram = etree.fromstring(after.read(f"{folder}/diagrams/{kind}1.xml"))
                assert drawing_texts(diagram)[-1] == "PLAN THE WORK"
                bold = diagram.find(".//{*}r/{*}rPr")
                assert (bold.get("b"), bold.getparent()[1].text) == ("1", "PLAN ")
    assert [p.text for p in docx.Document(tmp_path / "de-report.docx").paragraphs] == [
        "OUR SALES."]


def test_an_epub_comes_back_with_its_chapters_translated(server: ServerProcess,
                                                         tmp_path: Path) -> None:
    import zipfile

    import deepl
    from lxml import etree

    chapter = ('<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/'
               'xhtml"><head><title>One</title></head><body><h1>Chapter one</h1>'
               '<p>It was a <em>dark</em> night.</p><img src="a.png" alt="An owl"/></body></html>')
    # EPUB 2's package (a title, a description, an author) and table of contents (toc.ncx).
    package = ('<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="2.0">'
               '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>The owl</dc:title>'
               '<dc:creator>Ann Smith</dc:creator><dc:description>A story of one night.'
               '</dc:description><dc:language>en</dc:language></metadata>'
               '<manifest><item id="c1" href="text/one.xhtml" media-type="application/xhtml+xml"'
               '/><item id="css" href="style.css" media-type="text/css"/><item id="ncx" '
               'href="toc.ncx" media-type="application/x-dtbncx+xml"/></manifest>'
               '<spine toc="ncx"><itemref idref="c1"/></spine></package>')
    ncx = ('<?xml version="1.0"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" '
           'version="2005-1"><head><meta name="dtb:uid" content="owl-1"/></head><docTitle>'
           '<text>The owl</text></docTitle><navMap><navPoint id="n1" playOrder="1"><navLabel>'
           '<text>Chapter one</text></navLabel><content src="text/one.xhtml"/></navPoint>'
           '</navMap></ncx>')
    container = ('<?xml version="1.0"?><container xmlns="urn:oasis:names:tc:opendocument:xmlns:'
                 'container" version="1.0"><rootfiles><rootfile full-path="OEBPS/book.opf" '
                 'media-type="application/oebps-package+xml"/></rootfiles></container>')
    book = tmp_path / "book.epub"
    with zipfile.ZipFile(book, "w") as archive:
        archive.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        archive.writestr("META-INF/container.xml", container)
        archive.writestr("OEBPS/book.opf", package)
        archive.writestr("OEBPS/text/one.xhtml", chapter)
        archive.writestr("OEBPS/style.css", "p { margin: 0 }")
        archive.writestr("OEBPS/toc.ncx", ncx)
    client = deepl.Translator("k1", server_url=server.url)
    client.translate_document_from_filepath(book, tmp_path / "book.de.epub", target_lang="DE")
    with zipfile.ZipFile(tmp_path / "book.de.epub") as archive:
        first = archive.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
        translated = archive.read("OEBPS/text/one.xhtml").decode()
        assert archive.read("OEBPS/style.css") == b"p { margin: 0 }"
        opf, toc = (etree.fromstring(archive.read(f"OEBPS/{n}")) for n in ("book.opf", "toc.ncx"))
    dc = "{http://purl.org/dc/elements/1.1/}"
    assert [(e.tag, e.text) for e in opf[0]] == [
        (f"{dc}title", "THE OWL"), (f"{dc}creator", "Ann Smith"),
        (f"{dc}description", "A STORY OF ONE NIGHT."), (f"{dc}language", "en")]
    assert [e.get("href") for e in opf[1]] == ["text/one.xhtml", "style.css", "toc.ncx"]
    assert [t.text for t in toc.iter("{*}text")] == ["THE OWL", "CHAPTER ONE"]
    kept = [(e.get("name"), e.get("content"), e.get("src"))
            for e in toc.iter("{*}meta", "{*}content")]
    assert kept == [("dtb:uid", "owl-1", None), (None, None, "text/one.xhtml")]
    assert ('<h1>CHAPTER ONE</h1><p>IT WAS A <em>DARK</em> NIGHT.</p><img src="a.png" '
            'alt="AN OWL"/>') in translated
    assert translated.startswith('<?xml version="1.0" encoding="utf-8"?>')


ODT_CONTENT = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content '
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.2">'
    '<office:body><office:text><text:h text:outline-level="1">A title</text:h>'
    '<text:p>Press <text:span text:style-name="Bold">Enter</text:span><text:s/>now.</text:p>'
    '</office:text></office:body></office:document-content>')


def test_opendocument_text_keeps_its_spans(server: ServerProcess, tmp_path: Path) -> None:
    import zipfile

    import deepl

    document = tmp_path / "letter.odt"
    with zipfile.ZipFile(document, "w") as archive:
        archive.writestr("mimetype", "application/vnd.oasis.opendocument.text",
                         compress_type=zipfile.ZIP_STORED)
        archive.writestr("content.xml", ODT_CONTENT)
        archive.writestr("styles.xml", "<styles/>")
    client = deepl.Translator("k1", server_url=server.url)
    client.translate_document_from_filepath(document, tmp_path / "letter.de.odt",
                                            target_lang="DE")
    with zipfile.ZipFile(tmp_path / "letter.de.odt") as archive:
        assert archive.infolist()[0].filename == "mimetype"
        content = archive.read("content.xml").decode()
        assert archive.read("styles.xml") == b"<styles/>"
    assert '<text:h text:outline-level="1">A TITLE</text:h>' in content
    assert ('<text:p>PRESS <text:span text:style-name="Bold">ENTER</text:span><text:s/>NOW.'
            '</text:p>') in content


ODF_NAMESPACES = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
    'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
    'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0" '
    'xmlns:xlink="http://www.w3.org/1999/xlink"')
# A long body paragraph anchoring a picture and a text box and holding a footnote, as
# LibreOffice writes them, and a page header and footer in styles.xml.
ODT_ANCHORS = (
    f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content {ODF_NAMESPACES} '
    'office:version="1.3"><office:body><office:text><text:p text:style-name="P1">The results '
    '<draw:frame draw:name="Image1" text:anchor-type="char" svg:width="2cm"><draw:image '
    'xlink:href="Pictures/a.png"/><svg:title>A chart</svg:title><svg:desc>Bars by quarter'
    '</svg:desc></draw:frame>are shown here'
    '<text:note text:id="ftn1" text:note-class="footnote"><text:note-citation>1'
    '</text:note-citation><text:note-body><text:p text:style-name="Footnote">See the appendix.'
    '</text:p></text:note-body></text:note> and discussed below.<draw:frame draw:name="Box">'
    '<draw:text-box>'
    '<text:p>Words in a box.</text:p></draw:text-box></draw:frame></text:p>'
    '</office:text></office:body></office:document-content>')
ODT_STYLES = (
    f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-styles {ODF_NAMESPACES} '
    'office:version="1.3"><office:styles><style:style style:name="Standard"/></office:styles>'
    '<office:master-styles><style:master-page style:name="Standard"><style:header><text:p>'
    'Quarterly report</text:p></style:header><style:footer><text:p>Page <text:page-number>1'
    '</text:page-number> of the draft</text:p></style:footer></style:master-page>'
    '</office:master-styles></office:document-styles>')


def test_opendocument_frames_notes_headers_and_footers(server: ServerProcess,
                                                       tmp_path: Path) -> None:
    import zipfile

    import deepl
    from lxml import etree

    document = tmp_path / "report.odt"
    with zipfile.ZipFile(document, "w") as archive:
        archive.writestr("mimetype", "application/vnd.oasis.opendocument.text",
                         compress_type=zipfile.ZIP_STORED)
        archive.writestr("content.xml", ODT_ANCHORS)
        archive.writestr("styles.xml", ODT_STYLES)
        archive.writestr("Pictures/a.png", b"\x89PNG not really")
    client = deepl.Translator("k1", server_url=server.url)
    client.translate_document_from_filepath(document, tmp_path / "report.de.odt",
                                            target_lang="DE")
    text = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
    with zipfile.ZipFile(tmp_path / "report.de.odt") as archive:
        content = etree.fromstring(archive.read("content.xml"))
        styles = etree.fromstring(archive.read("styles.xml"))
        assert archive.read("Pictures/a.png") == b"\x89PNG not really"
    body = content.find(f".//{text}p")
    own = [body.text] + [child.tail for child in body]
    assert own == ["THE RESULTS ", "ARE SHOWN HERE", " AND DISCUSSED BELOW.", None]
    assert [etree.QName(child).localname for child in body] == ["frame", "note", "frame"]
    assert body[0][0].get("{http://www.w3.org/1999/xlink}href") == "Pictures/a.png"
    svg = "{urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0}"
    assert [(e.tag, e.text) for e in body[0][1:]] == [(f"{svg}title", "A CHART"),
                                                     (f"{svg}desc", "BARS BY QUARTER")]
    inner = ["".join(p.itertext()) for p in body.iter(f"{text}p") if p is not body]
    assert inner == ["SEE THE APPENDIX.", "WORDS IN A BOX."]
    assert body.find(f".//{text}note-citation").text == "1"
    assert ["".join(p.itertext()) for p in styles.iter(f"{text}p")] == [
        "QUARTERLY REPORT", "PAGE 1 OF THE DRAFT"]


def test_markdown_keeps_its_structure_and_inline_formatting(server: ServerProcess) -> None:
    from markdown_it import MarkdownIt

    source = (Path(__file__).parent / "fixtures" / "documents" / "guide.md").read_text()
    out = translated_file(server, "guide.md", source)
    assert out.startswith("---\ntitle: Getting started\ntags: [intro]\n---\n")  # untouched
    # A sentence across a link, emphasis and a code span is one text; the link's address, the
    # code and the autolinks come back as they were, its title translated.
    assert ('RUN THE COMMAND BELOW, THEN OPEN [THE PAGE](http://localhost:8000 "HOME") IN A '
            "**BROWSER**. IT TAKES `make serve` AND ABOUT A MINUTE.") in out
    assert "# INSTALL THE *SERVER*" in out and "## NEXT STEPS WITH `translate-keys`" in out
    assert "- FIRST ITEM WITH ~~OLD~~ TEXT" in out
    assert "> A QUOTED LINE THAT CONTINUES." in out
    assert "| `id` | THE *IDENTIFIER* OF A ROW |" in out
    assert '```python\nprint("not translated")\n```' in out
    # An image's alt text is text; a number word the fake engine left in English is written
    # in German by the service ("Two" as "Zwei").
    assert "1. ONE\n2. Zwei ![A CAT](cat.png)" in out
    assert '<div class="note">RAW HTML BLOCK</div>' in out
    assert "VISIT https://example.com OR WRITE TO <info@example.com>." in out
    # Text that Markdown would read as syntax is escaped again; the reference stays one.
    assert "A LITERAL \\*STAR\\*, 1 < 2 AND A [REFERENCE LINK][manual]." in out
    assert '[manual]: https://example.com/manual "Manual"' in out

    def blocks(text: str) -> list[str]:
        return [token.type for token in MarkdownIt("commonmark").enable("table").parse(text)]

    assert blocks(out) == blocks(source)  # the same structure, block for block


def test_markdown_math_and_footnotes_come_back_as_written(server: ServerProcess) -> None:
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.footnote import footnote_plugin

    source = ("Einstein wrote $E = mc^2$ in a paper[^1] and **this** too.\n\n"
              "$$\n\\int_0^1 x_i \\, dx = \\frac{1}{2}\n$$\n\n"
              "[^1]: A note with *emphasis* and $a_i$.\n")
    out = translated_file(server, "physics.md", source)
    assert out == ("EINSTEIN WROTE $E = mc^2$ IN A PAPER[^1] AND **THIS** TOO.\n\n"
                   "$$\n\\int_0^1 x_i \\, dx = \\frac{1}{2}\n$$\n\n"
                   "[^1]: A NOTE WITH *EMPHASIS* AND $a_i$.\n")
    parser = MarkdownIt("commonmark").use(dollarmath_plugin).use(footnote_plugin)
    kinds = [token.type for token in parser.parse(out)]
    assert kinds.count("math_block") == 1 and "footnote_block_open" in kinds


def test_an_indented_html_paragraph_is_one_text(server: ServerProcess) -> None:
    # Pretty-printed HTML (an EPUB's, an editor's) wraps a sentence over indented lines: in
    # HTML that is one space, not a line break or a column.
    out = translated_file(server, "page.html", "<p>\n\t\tThe first line\n\t\tcontinues "
                                               "here.\n\t</p>")
    assert out == "<p>\n\t\tTHE FIRST LINE CONTINUES HERE.\n\t</p>"


def test_a_document_already_in_the_target_language_comes_back_as_it_was(
        server: ServerProcess) -> None:
    # Left to detection, a page written in the target language is not translated: it comes
    # back byte for byte, its whitespace and line ends too (as a text does through /translate).
    page = ("<p>\n\t\tDas ist ein ganz normaler deutscher Satz über das Wetter  und den "
            "Garten,\r\n\t\tder im Sommer blüht.\n\t</p>\r\n")
    assert translated_file(server, "seite.html", page) == page
    english = "<p>\n\t\tThis is an ordinary English sentence about the garden.\n\t</p>"
    assert translated_file(server, "page.html", english) == (
        "<p>\n\t\tTHIS IS AN ORDINARY ENGLISH SENTENCE ABOUT THE GARDEN.\n\t</p>")
