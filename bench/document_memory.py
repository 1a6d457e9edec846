"""Peak resident memory of a document upload, by format, for the largest files the limits let
through and for hostile ones.

    python bench/document_memory.py [--chars 500000] [--only docx,html]

For each case a file is built here (nothing is downloaded), then fresh processes (so that no
stage inherits another's heap) take it through what the service does with an upload:

1. **worker: check**: what a document worker process runs for an upload
   (``service.documents.parsers.upload_words``), under the worker's memory cap
   (DOCUMENT_WORKER_MB): a zip's entries inflated and counted (declared and actual sizes,
   text characters, elements), the file read once for its words, the limits checked;
2. **worker: job**: what a worker runs for a job: the format's reader for the texts, then the
   file read again and written with each text given back unchanged (``read_texts``,
   ``rewritten``);
3. **server**: what the server itself holds of a document: the texts the worker hands it
   (a markup format's already cut into segments), received as the pool's pipe delivers them
   (unpickled); the decoding's own memory is the scheduler's, the same for sentences of any
   origin.

It prints, per case, the upload's size, the outcome of the check (accepted, or the status
and the start of the refusal), and the peak resident memory each stage added to its process
(``VmHWM`` after the stage, reset through ``/proc/self/clear_refs`` before it, less
``VmRSS`` before it), with its seconds. The worker's peak bounds what each of the
DOCUMENT_WORKERS processes holds above its own start; the server's what each document being
translated adds to the server (docs/documents.md, "Memory"). Linux only.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import pickle
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.memory import rss_mib  # noqa: E402

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
         "seven", "wizards", "quietly", "box", "jackdaws", "near", "the", "old", "harbour",
         "and", "every", "ledger", "stays", "open"]


def fitted(build: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """``build`` given the text size that makes its file hold just under ``chars``
    characters, as the service counts them (all of a text file's, a zip's words)."""

    def fit(chars: int) -> bytes:
        size = chars
        for _ in range(4):
            data = build(size)
            counted = count_chars(data)
            if counted < chars and counted > 0.97 * chars:
                return data
            size = int(size * 0.985 * chars / max(1, counted))
        return data

    return fit


def count_chars(data: bytes) -> int:
    if data[:2] == b"PK":
        import docx  # noqa: F401  (the readers' libraries, imported once)

        from service.documents import BY_EXTENSION

        for extension in (".docx", ".pptx", ".odt", ".epub"):
            try:
                return len(BY_EXTENSION[extension].words(data))  # type: ignore[misc]
            except Exception:  # not this format
                continue
    return len(data.decode())


def prose(chars: int, seed: int = 0) -> str:
    """Sentences of ordinary words, about ``chars`` characters."""
    out, length, i = [], 0, seed
    while length < chars:
        sentence = " ".join(WORDS[(i + k * 7) % len(WORDS)] for k in range(12)).capitalize()
        out.append(sentence + ".")
        length += len(sentence) + 2
        i += 1
    return " ".join(out)[:chars]


# -- zipped formats ---------------------------------------------------------------------------


def rezipped(template: bytes, replaced: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(template)) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, replaced.pop(info.filename, None)
                            or source.read(info))
        for name, content in replaced.items():
            target.writestr(name, content)
    return out.getvalue()


def docx_with(body: str) -> bytes:
    """python-docx's blank document with ``body`` as its body's content."""
    import docx

    out = io.BytesIO()
    docx.Document().save(out)
    ns = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    return rezipped(out.getvalue(), {"word/document.xml": (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document {ns}>'
        f"<w:body>{body}</w:body></w:document>").encode()})


def docx_largest(chars: int) -> bytes:
    """Paragraphs of eight formatted runs, as a Word document of prose is written."""
    text, paragraphs, at = prose(chars), [], 0
    while at < len(text):
        runs = []
        for k in range(8):
            piece = text[at:at + 50]
            at += 50
            style = "<w:rPr><w:b/><w:i/><w:sz w:val=\"24\"/></w:rPr>" if k % 2 else ""
            runs.append(f'<w:r>{style}<w:t xml:space="preserve">{piece}</w:t></w:r>')
        paragraphs.append(f"<w:p><w:pPr><w:spacing w:after=\"120\"/></w:pPr>{''.join(runs)}</w:p>")
    return docx_with("".join(paragraphs))


def tokens(count: int) -> list[str]:
    """``count`` random 8-digit hex numbers (revision ids, style names): enough entropy that
    a file of empty elements deflates as real ones do, not as a zip bomb."""
    import random

    pool = random.Random(7)
    return [f"{pool.getrandbits(32):08X}" for _ in range(count)]


def docx_elements(chars: int) -> bytes:
    """Empty runs in empty paragraphs, three elements each, up to just under the element
    limit (``service.documents.archives.max_elements``)."""
    from service.documents.archives import max_elements

    count = (max_elements(chars) - 20_000) // 3
    return docx_with("".join(f'<w:p><w:r w:rsidR="{t}"><w:t></w:t></w:r></w:p>'
                             for t in tokens(count)))


def docx_paragraph(chars: int) -> bytes:
    return docx_with(f"<w:p><w:r><w:t>{prose(chars - 200)}</w:t></w:r></w:p>")


def docx_deep(chars: int) -> bytes:
    return docx_with("<w:sdt><w:sdtContent>" * 20_000 + "<w:p><w:r><w:t>Deep.</w:t></w:r></w:p>"
                     + "</w:sdtContent></w:sdt>" * 20_000)


def docx_probe(chars: int) -> bytes:
    """A 59 MB document.xml of short numbered paragraphs in a 2.6 MB upload: within the zip
    limits (its ratio is 23), 20 million characters of text."""
    return docx_with("".join(f"<w:p><w:r><w:t>Words in paragraph {i}.</w:t></w:r></w:p>"
                             for i in range(1_000_000)))


def docx_lying(chars: int) -> bytes:
    """A real document with one more entry: 256 MB of zeros whose headers say 1,000 bytes."""
    from tests.test_documents import deflated, zip_by_hand

    template = docx_largest(1000)
    entries = []
    with zipfile.ZipFile(io.BytesIO(template)) as archive:
        for info in archive.infolist():
            entries.append((info.filename, *deflated(iter([archive.read(info)]))))
    packed, crc, _ = deflated(bytes(1 << 20) for _ in range(256))
    entries.append(("word/media/image1.png", packed, crc, 1000))
    return zip_by_hand(entries)


def pptx_largest(chars: int) -> bytes:
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    text, at = prose(chars), 0
    while at < len(text):
        slide = deck.slides.add_slide(deck.slide_layouts[6])
        frame = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(8), Inches(5)).text_frame
        frame.text = text[at:at + 400]
        for _ in range(4):
            frame.add_paragraph().text = text[at + 400:at + 800]
            at += 400
        at += 400
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def odf_with(body: str) -> bytes:
    ns = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
          'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"')
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {ns}>'
               f"<office:body><office:text>{body}</office:text></office:body>"
               "</office:document-content>")
    manifest = ('<?xml version="1.0" encoding="UTF-8"?><manifest:manifest xmlns:manifest='
                '"urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"><manifest:file-entry '
                'manifest:full-path="/" manifest:media-type='
                '"application/vnd.oasis.opendocument.text"/></manifest:manifest>')
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", "application/vnd.oasis.opendocument.text",
                         compress_type=zipfile.ZIP_STORED)
        archive.writestr("content.xml", content)
        archive.writestr("META-INF/manifest.xml", manifest)
    return out.getvalue()


def odt_largest(chars: int) -> bytes:
    text = prose(chars)
    return odf_with("".join(
        f'<text:p>{text[at:at + 200]}<text:span text:style-name="T1">{text[at + 200:at + 400]}'
        "</text:span></text:p>" for at in range(0, len(text), 400)))


def odt_elements(chars: int) -> bytes:
    from service.documents.archives import max_elements

    count = (max_elements(chars) - 20_000) // 2
    return odf_with("".join(f'<text:p><text:span text:style-name="{t}"/></text:p>'
                            for t in tokens(count)))


def epub_with(chapters: list[str]) -> bytes:
    container = ('<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:'
                 'opendocument:xmlns:container"><rootfiles><rootfile full-path="OEBPS/'
                 'content.opf" media-type="application/oebps-package+xml"/></rootfiles>'
                 "</container>")
    items = "".join(f'<item id="c{i}" href="c{i}.xhtml" media-type="application/xhtml+xml"/>'
                    for i in range(len(chapters)))
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(chapters)))
    package = (f'<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" '
               f'version="3.0"><manifest>{items}</manifest><spine>{spine}</spine></package>')
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        archive.writestr("META-INF/container.xml", container)
        archive.writestr("OEBPS/content.opf", package)
        for i, chapter in enumerate(chapters):
            archive.writestr(f"OEBPS/c{i}.xhtml", '<?xml version="1.0"?><html xmlns='
                             f'"http://www.w3.org/1999/xhtml"><body>{chapter}</body></html>')
    return out.getvalue()


def epub_largest(chars: int) -> bytes:
    text = prose(chars)
    chapter = 25_000
    return epub_with(["".join(f"<p>{text[p:p + 150]}<em>{text[p + 150:p + 250]}</em></p>"
                              for p in range(at, min(at + chapter, len(text)), 250))
                      for at in range(0, len(text), chapter)])


def epub_deep(chars: int) -> bytes:
    return epub_with(["".join(f'<div id="{t}">' for t in tokens(30_000)) + "Deep."
                      + "</div>" * 30_000])


# -- text formats -----------------------------------------------------------------------------


def html_largest(chars: int) -> bytes:
    text, parts, at = prose(chars), [], 0
    while sum(map(len, parts)) < chars - 400:
        parts.append(f"<p>{text[at:at + 150]} <b>{text[at + 150:at + 200]}</b> "
                     f'<a href="/x">{text[at + 200:at + 260]}</a></p>\n')
        at += 260
    return "".join(parts).encode()


def html_deep(chars: int) -> bytes:
    depth = (chars - 100) // 11
    return ("<div>" * depth + "Deep." + "</div>" * depth).encode()


def html_paragraph(chars: int) -> bytes:
    return f"<p>{prose(chars - 10)}</p>".encode()


def markdown_largest(chars: int) -> bytes:
    text = prose(chars - 2000)
    return "".join(f"## Part {at}\n\n{text[at:at + 200]} **{text[at + 200:at + 260]}** "
                   f"[link](https://example.com/{at}).\n\n- {text[at + 260:at + 300]}\n\n"
                   for at in range(0, len(text) - 400, 330)).encode()


def markdown_deep(chars: int) -> bytes:
    return ("> " * (chars // 2 - 100) + "Deep.\n").encode()


def po_largest(chars: int) -> bytes:
    text = prose(chars - 1000)
    head = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
    return (head + "".join(f'msgid "{text[at:at + 180]}"\nmsgstr ""\n\n'
                           for at in range(0, len(text) - 200, 180))).encode()


def po_one_message(chars: int) -> bytes:
    head = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
    return (head + f'msgid "{prose(chars - 200)}"\nmsgstr ""\n').encode()


def xliff_largest(chars: int) -> bytes:
    text = prose(chars - 30_000)
    units = "".join(f'<trans-unit id="u{at}"><source>{text[at:at + 150]} <g id="1">'
                    f"{text[at + 150:at + 180]}</g></source></trans-unit>"
                    for at in range(0, len(text) - 200, 180))
    return ('<?xml version="1.0"?><xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:'
            'document:1.2"><file source-language="en" datatype="plaintext" original="x">'
            f"<body>{units}</body></file></xliff>").encode()


def _cues(chars: int, header: str, cue: Callable[[int, str, str], str]) -> bytes:
    """Subtitles of 90-character cues three seconds apart, ``cue(number, stamp, text)`` each."""
    text, cues = prose(chars - 40_000), [header]
    for number, at in enumerate(range(0, len(text) - 100, 90), 1):
        seconds = number * 3
        stamp = f"{seconds // 3600:02}:{seconds // 60 % 60:02}:{seconds % 60:02}"
        cues.append(cue(number, stamp, text[at:at + 90]))
    return "".join(cues).encode()


def srt_largest(chars: int) -> bytes:
    return _cues(chars, "", lambda number, stamp, text:
                 f"{number}\n{stamp},000 --> {stamp},900\n{text}\n\n")


def vtt_largest(chars: int) -> bytes:
    return _cues(chars, "WEBVTT\n\n", lambda _, stamp, text:
                 f"{stamp}.000 --> {stamp}.900\n{text}\n\n")


def srt_one_cue(chars: int) -> bytes:
    return f"1\n00:00:01,000 --> 00:00:02,000\n{prose(chars - 100)}\n".encode()


def txt_largest(chars: int) -> bytes:
    text = prose(chars - 5000)
    return "\n\n".join(text[at:at + 300] for at in range(0, len(text), 300)).encode()


def txt_paragraph(chars: int) -> bytes:
    return prose(chars - 10).encode()


def bomb(chars: int) -> bytes:
    """A DOCX whose one extra entry inflates 1,000 times (refused as a zip bomb)."""
    return rezipped(docx_largest(1000), {"word/media/zeros.bin": bytes(50_000_000)})


CASES: dict[str, tuple[str, Callable[[int], bytes]]] = {
    "docx largest": ("a.docx", fitted(docx_largest)),
    "docx empty elements": ("a.docx", docx_elements),
    "docx one paragraph": ("a.docx", docx_paragraph),
    "docx deep nesting": ("a.docx", docx_deep),
    "docx 59 MB xml": ("a.docx", docx_probe),
    "docx lying header": ("a.docx", docx_lying),
    "docx zip bomb": ("a.docx", bomb),
    "pptx largest": ("a.pptx", fitted(pptx_largest)),
    "odt largest": ("a.odt", fitted(odt_largest)),
    "odt empty elements": ("a.odt", odt_elements),
    "epub largest": ("a.epub", fitted(epub_largest)),
    "epub deep nesting": ("a.epub", epub_deep),
    "html largest": ("a.html", fitted(html_largest)),
    "html deep nesting": ("a.html", html_deep),
    "html one paragraph": ("a.html", html_paragraph),
    "markdown largest": ("a.md", fitted(markdown_largest)),
    "markdown deep nesting": ("a.md", markdown_deep),
    "po largest": ("a.po", fitted(po_largest)),
    "po one message": ("a.po", po_one_message),
    "xliff largest": ("a.xlf", fitted(xliff_largest)),
    "srt largest": ("a.srt", fitted(srt_largest)),
    "srt one cue": ("a.srt", srt_one_cue),
    "vtt largest": ("a.vtt", fitted(vtt_largest)),
    "txt largest": ("a.txt", fitted(txt_largest)),
    "txt one paragraph": ("a.txt", txt_paragraph),
}


def multipart(filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = "benchboundary7d1f"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"target_lang\"\r\n\r\nde"
            f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def _stage(work: Callable[[], object]) -> tuple[float, float, object]:
    """(MiB the stage's peak added, seconds, what ``work`` returned or raised)."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to VmRSS
    before = rss_mib()[0]
    started = time.perf_counter()
    try:
        outcome: object = work()
    except Exception as exc:  # a refusal is an outcome
        outcome = exc
    return rss_mib()[1] - before, time.perf_counter() - started, outcome


def measure(stage: str, filename: str, data: bytes, chars: int, texts: list[str] | None,
            handed: bytes, results) -> None:
    """One stage of one case, in a process of its own (so that the pages a stage freed are
    not counted again for the next), capped as a document worker is."""
    from service.documents import document_format
    from service.documents.parsers import _cap_memory, read_texts, rewritten, upload_words
    from service.settings import Settings

    settings = Settings(max_document_chars=chars)
    kind = document_format(filename)
    source: str | bytes = data if kind.binary else data.decode()
    if stage == "check":
        _cap_memory(settings.document_worker_mb)
        what = f"{kind.extensions[0][1:].upper()} file"
        done = _stage(lambda: upload_words(kind.name, data, chars, what))
        outcome = done[2]
        results.send((*done[:2], f"refused {getattr(outcome, 'status', '')}: "
                      f"{str(outcome)[:70]}" if isinstance(outcome, Exception) else "accepted"))
        return
    if stage == "job":
        _cap_memory(settings.document_worker_mb)

        def job() -> object:
            return len(read_texts(kind.name, source)), rewritten(kind.name, source, texts or [])

        done = _stage(job)
        outcome = done[2]
        results.send((*done[:2], outcome if isinstance(outcome, Exception)
                      else f"{outcome[0]} texts"))  # type: ignore[index]
        return

    done = _stage(lambda: pickle.loads(handed))  # the server's share: the texts received
    results.send((*done[:2], ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=500_000, help="MAX_DOCUMENT_CHARS")
    parser.add_argument("--only", default="", help="comma-separated words a case's name has")
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    context = multiprocessing.get_context("spawn")
    print(f"{'':<24} {'':>10}  {'worker: check':>13}  {'worker: job':>13}  "
          f"{'server':>13}")
    print(f"{'case':<24} {'upload':>10}  {'MiB':>6} {'s':>6}  {'MiB':>6} {'s':>6}  {'MiB':>6} "
          f"{'s':>6}  outcome")
    for name, (filename, build) in CASES.items():
        if wanted and not any(w in name for w in wanted):
            continue
        data = build(args.chars)
        figures: dict[str, tuple] = {}
        texts = None
        for stage in ("check", "job", "server"):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=measure,
                                    args=(stage, filename, data, args.chars, texts,
                                          pickle.dumps(texts), send))
            child.start()
            figures[stage] = receive.recv()
            child.join()
            if not figures["check"][2].startswith("accepted"):
                break
            if texts is None:  # the job's texts, as the worker hands them to the server
                from service.documents import document_format
                from service.documents.parsers import read_texts

                kind = document_format(filename)
                texts = read_texts(kind.name, data if kind.binary else data.decode())
        check = figures["check"]
        line = f"{name:<24} {len(data) / 1e6:>8.2f}MB  {check[0]:>6.0f} {check[1]:>6.2f}"
        for stage in ("job", "server"):
            found = figures.get(stage)
            line += f"  {found[0]:>6.0f} {found[1]:>6.2f}" if found else f"  {'-':>6} {'-':>6}"
        outcome = f"accepted ({figures['job'][2]})" if "job" in figures else check[2]
        print(f"{line}  {outcome}", flush=True)


if __name__ == "__main__":
    main()
