"""Documents under attack: a file's text and elements counted while it inflates, before any
parser builds its tree; and every document accepted translated, however many arrive together
and however long their paragraphs, while interactive requests keep being answered."""

from __future__ import annotations

import asyncio
import io
import random
import time
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.documents import DocumentError
from service.documents.archives import MIN_ELEMENTS, MarkupCount, check_zip, max_elements
from tests.test_server import ServerProcess, fake_server

WORD_NS = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def docx_with(body: str) -> bytes:
    """python-docx's blank document with ``body`` as its body's content."""
    import docx

    blank = io.BytesIO()
    docx.Document().save(blank)
    out = io.BytesIO()
    with zipfile.ZipFile(blank) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            content = source.read(info)
            if info.filename == "word/document.xml":
                content = (f'<?xml version="1.0" encoding="UTF-8"?><w:document {WORD_NS}>'
                           f"<w:body>{body}</w:body></w:document>").encode()
            target.writestr(info.filename, content)
    return out.getvalue()


def probe_docx() -> bytes:
    """A small upload whose document.xml inflates to 50 MB of short paragraphs: within the
    zip's limits (its ratio is under 200), 20 million characters of text."""
    return docx_with("".join(f"<w:p><w:r><w:t>Words in paragraph {i}.</w:t></w:r></w:p>"
                             for i in range(1_000_000)))


def empty_elements_docx(count: int) -> bytes:
    """``count`` empty runs in empty paragraphs (three elements each), with revision ids
    random enough that the file deflates as real ones do, not as a zip bomb."""
    pool = random.Random(3)
    return docx_with("".join(f'<w:p><w:r w:rsidR="{pool.getrandbits(32):08X}"><w:t></w:t>'
                             "</w:r></w:p>" for _ in range(count)))


def test_markup_is_counted_the_same_however_it_is_cut() -> None:
    markup = ('<w:p><w:r><w:t xml:space="preserve">Fish &amp; chips, </w:t></w:r>\n  '
              '<w:r w:rsidR="00AB"><w:t>日本語</w:t></w:r><w:br/></w:p>').encode()
    whole = MarkupCount("file", 10_000, 10_000)
    whole.feed(markup)
    # Text without whitespace (an entity is one character, a CJK character one, not three
    # bytes), and elements (opening and empty tags; closing tags are not elements).
    assert (whole.characters, whole.elements) == (len("Fish&chips,日本語"), 6)
    for cut in range(1, len(markup)):
        count = MarkupCount("file", 10_000, 10_000)
        count.feed(markup[:cut])
        count.feed(markup[cut:])
        assert (count.characters, count.elements) == (whole.characters, whole.elements), cut


def test_a_tag_without_end_is_refused_at_its_limit() -> None:
    count = MarkupCount("DOCX file", 10, 10)
    count.feed(b"<w:t ")
    with pytest.raises(DocumentError, match="tag longer than") as refused:
        for _ in range(20):
            count.feed(b' a="' + b"x" * 65_536 + b'"')
    assert refused.value.status == 413


def test_the_probes_document_is_refused_while_it_inflates_in_bounded_memory() -> None:
    data = probe_docx()
    assert len(data) < 5_000_000
    check_zip(data, "DOCX file")  # every zip limit passes: only its text is too long
    tracemalloc.start()
    try:
        with pytest.raises(DocumentError, match=r"more than 200000 characters of text; at "
                           r"most 200000 \(MAX_DOCUMENT_CHARS\)") as refused:
            check_zip(data, "DOCX file", max_chars=200_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.status == 413
    # The upload, its deflated entry's copy and a few chunks: never the 50 MB inflated, nor
    # a tree (which took 3.9 GB).
    assert peak < 2 * len(data) + 2_000_000, peak


def test_a_document_of_empty_elements_is_refused_for_its_elements() -> None:
    assert max_elements(1000) == MIN_ELEMENTS and max_elements(10**6) == 10**6
    data = empty_elements_docx(MIN_ELEMENTS // 3 + 1000)
    check_zip(data, "DOCX file")  # not a zip bomb
    with pytest.raises(DocumentError, match=f"more than {MIN_ELEMENTS} XML elements") as refused:
        check_zip(data, "DOCX file", max_chars=1000)
    assert refused.value.status == 413
    check_zip(empty_elements_docx(1000), "DOCX file", max_chars=1000)  # fewer pass


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits")
    # The fake engine decodes in Python, holding the GIL that the real engine releases: the
    # event loop lags behind it by up to a second under these tests' load, and shedding
    # (MAX_LOOP_LAG_S) would turn them into tests of the fake engine's speed.
    env = {"DATA_DIR": str(root / "data"), "MAX_DOCUMENT_CHARS": "200000",
           "MAX_DOCUMENTS": "100", "MAX_LOOP_LAG_S": "30"}
    with fake_server(root, env=env, step_s=0.001) as served:
        yield served


def test_an_upload_over_the_limits_gets_a_413_naming_the_file_field(
        server: ServerProcess) -> None:
    for name, data, words in (("probe.docx", probe_docx(), "characters of text"),
                              ("runs.docx", empty_elements_docx(70_000), "XML elements")):
        refused = httpx.post(server.url + "/translate/document", data={"target_lang": "de"},
                             files={"file": (name, data)}, timeout=60)
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["field"] == "file" and words in error["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def long_paragraph(sentences: int, seed: int) -> str:
    return " ".join(f"Sentence {seed} number {i} has words." for i in range(sentences))


def documents(count: int) -> list[tuple[str, bytes]]:
    """Documents whose paragraphs hold more sentences than one request may (512): plain
    text, HTML and a catalogue's message, in turn."""
    made = []
    for i in range(count):
        paragraph = long_paragraph(600, i)
        if i % 3 == 0:
            made.append((f"d{i}.txt", f"Title {i}\n\n{paragraph}\n".encode()))
        elif i % 3 == 1:
            made.append((f"d{i}.html", f"<h1>Title {i}</h1><p>{paragraph}</p>".encode()))
        else:
            made.append((f"d{i}.po", f'msgid "{paragraph}"\nmsgstr ""\n'.encode()))
    return made


def test_documents_accepted_together_all_complete_while_texts_are_answered(
        server: ServerProcess) -> None:
    async def main() -> tuple[list[str], list[int], list[float], float]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            async def upload(name: str, data: bytes) -> tuple[str, str]:
                answer = await client.post("/translate/document", data={"target_lang": "de"},
                                           files={"file": (name, data)})
                assert answer.status_code == 202, answer.text
                return answer.json()["document_id"], answer.json()["document_key"]

            accepted = await asyncio.gather(*(upload(n, d) for n, d in documents(24)))
            statuses: list[str] = []
            done_at: list[float] = []

            async def finished(document_id: str, key: str) -> None:
                while True:
                    answer = await client.get(f"/translate/document/{document_id}",
                                              params={"document_key": key})
                    assert answer.status_code == 200, answer.text
                    status = answer.json()["status"]
                    if status in ("done", "error"):
                        statuses.append(status)
                        done_at.append(time.monotonic())
                        return
                    await asyncio.sleep(0.1)

            texts: list[int] = []
            answered_at = 0.0

            async def interactive() -> None:
                nonlocal answered_at
                for i in range(20):
                    answer = await client.post("/translate", json={
                        "text": f"An interactive sentence {i}.", "target_lang": "de"})
                    texts.append(answer.status_code)
                answered_at = time.monotonic()

            await asyncio.gather(interactive(), *(finished(*a) for a in accepted))
            return statuses, texts, done_at, answered_at

    statuses, texts, done_at, answered_at = asyncio.run(main())
    assert statuses == ["done"] * 24
    assert texts == [200] * 20
    # The interactive requests, sent one after another while the documents waited, were all
    # answered before the last document was done: they did not queue behind them.
    assert answered_at < max(done_at)


def test_documents_beyond_the_workers_wait_as_queued(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # DOCUMENT_WORKERS (2) documents translate at once: of three uploaded together, one
    # waits as "queued" while the others translate, and all complete. Decoder steps of 50 ms
    # make each document take seconds, however fast the uploads are answered.
    root = tmp_path_factory.mktemp("queued")
    env = {"DATA_DIR": str(root / "data"), "MAX_LOOP_LAG_S": "30"}
    documents = [(f"long{i}.txt", long_paragraph(2000, 200 + i).encode()) for i in range(3)]

    async def main(url: str) -> list[list[str]]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async def upload(name: str, data: bytes) -> dict[str, str]:
                answer = await client.post("/translate/document", data={"target_lang": "de"},
                                           files={"file": (name, data)})
                assert answer.status_code == 202, answer.text
                return answer.json()

            accepted = await asyncio.gather(*(upload(*document) for document in documents))
            polls: list[list[str]] = []
            while not polls or any(status != "done" for status in polls[-1]):
                polls.append([(await client.get(
                    f"/translate/document/{document['document_id']}",
                    params={"document_key": document["document_key"]})).json()["status"]
                    for document in accepted])
                assert "error" not in polls[-1]
                await asyncio.sleep(0.1)
            return polls

    with fake_server(root, env=env, step_s=0.05) as served:
        polls = asyncio.run(main(served.url))
    # Without the limit a job starts translating before its upload is even answered, and
    # none is ever seen queued. (A poll asks for each document in turn, so it is no
    # snapshot: counting those translating in one would prove nothing.)
    assert any("translating" in poll and "queued" in poll for poll in polls), polls[:5]


def test_the_document_workers_end_with_a_server_killed_outright(tmp_path_factory) -> None:
    """A worker waits on a queue whose writing end it holds itself: without its watch on
    the server, a server killed with SIGKILL left its workers waiting for ever."""
    import os
    import signal

    root = tmp_path_factory.mktemp("killed")
    with fake_server(root, env={"DATA_DIR": str(root / "data")}, step_s=0.001) as served:
        answer = httpx.post(served.url + "/translate/document", data={"target_lang": "de"},
                            files={"file": ("a.txt", b"Start the workers.")})
        assert answer.status_code == 202, answer.text
        pid = served.process.pid
        workers = [int(entry.name) for entry in Path("/proc").iterdir()
                   if entry.name.isdigit() and _parent(entry) == pid
                   and b"multiprocessing.spawn" in _command(entry)]
        assert workers  # the check ran in one
        os.kill(pid, signal.SIGKILL)
        served.process.wait(10)
    stop = time.monotonic() + 30
    while time.monotonic() < stop and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.2)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()]


def test_a_server_stopped_after_documents_ends_its_workers_cleanly(tmp_path_factory) -> None:
    """SIGTERM: the workers end with the server, and nothing of theirs is reported leaked
    (a pool left to the interpreter's exit had its semaphores reported by the resource
    tracker, a warning in every operator's log)."""
    import signal

    root = tmp_path_factory.mktemp("stopped")
    with fake_server(root, env={"DATA_DIR": str(root / "data")}, step_s=0.001) as served:
        answer = httpx.post(served.url + "/translate/document", data={"target_lang": "de"},
                            files={"file": ("a.txt", b"Start the workers.")})
        assert answer.status_code == 202, answer.text
        assert served.stop() in (0, -signal.SIGTERM), "".join(served.log)
    assert not [line for line in served.log if "leaked" in line or "Traceback" in line]


def _parent(process: Path) -> int:
    try:
        return int((process / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _command(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes()
    except OSError:
        return b""


def test_the_documents_accepted_hold_at_most_their_memory_budget(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # DOCUMENT_MEMORY_MB bounds the uploads and translated files held at once: past it an
    # upload is refused before its 202, with Retry-After, while a smaller one still fits, and
    # one larger than the whole budget is refused as too large. Decoder steps of 50 ms keep
    # the first document translating (its upload held) throughout.
    root = tmp_path_factory.mktemp("budget")
    env = {"DATA_DIR": str(root / "data"), "DOCUMENT_MEMORY_MB": "1",
           "MAX_DOCUMENT_CHARS": "2000000", "MAX_LOOP_LAG_S": "30"}
    with fake_server(root, env=env, step_s=0.05) as served:
        def upload(name: str, size: int) -> httpx.Response:
            text = long_paragraph(size // 35 + 1, size)[:size]
            return httpx.post(served.url + "/translate/document", data={"target_lang": "de"},
                              files={"file": (name, text.encode())}, timeout=60)

        assert upload("first.txt", 700_000).status_code == 202
        refused = upload("second.txt", 700_000)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] and "DOCUMENT_MEMORY_MB" in refused.text
        assert upload("small.txt", 200_000).status_code == 202
        too_large = upload("huge.txt", 1_200_000)
        assert too_large.status_code == 413, too_large.text
        assert too_large.json()["error"]["field"] == "file"
        assert "DOCUMENT_MEMORY_MB" in too_large.json()["error"]["message"]
