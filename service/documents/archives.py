"""Zipped documents (Office, OpenDocument, EPUB): checked before any parser opens them, and
written back with only the entries translated changed."""

from __future__ import annotations

import io
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass

from service.documents.errors import DocumentError

# A zipped document is refused when its entries inflate to more than this in all, or at a
# ratio to the upload above this (a zip bomb), before any parser opens it.
MAX_UNPACKED_BYTES, MAX_ZIP_RATIO = 200_000_000, 200
_CHUNK = 1 << 16  # inflated at most this much at a time while an entry is measured
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and extra field's lengths
# The entries a reader parses into a tree (XML parts, XHTML chapters, package documents):
# their text and elements are counted as they inflate, before any parser opens them.
_MARKUP_ENTRY = re.compile(r"\.(xml|rels|xhtml|html?|opf|ncx|svg)$", re.IGNORECASE)
# A document may hold as many XML elements as MAX_DOCUMENT_CHARS allows characters (times
# this), and never fewer than MIN_ELEMENTS (an empty Word file holds about 1,000). A parsed
# element costs about 250 bytes of tree and its reader's time: 2,000,000 empty OpenDocument
# spans took 532 MiB and 24 s to read, within every other limit. Prose holds about 0.1
# elements a character, a table of short cells up to 5, so a document at the character limit
# is never refused for its elements (bench/document_memory.py; docs/documents.md, "Memory").
ELEMENTS_PER_CHAR, MIN_ELEMENTS = 1, 100_000
# A tag (with its attributes) longer than this is refused: the count carries a tag cut by a
# chunk's end over to the next chunk, and no document's tag is anywhere near it.
MAX_TAG_BYTES = 1 << 20
_TAG = re.compile(rb"<[^>]*>")
_ENTITY = re.compile(rb"&#?\w{1,12};")
_SPACE = re.compile(rb"\s+")
_CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8's continuation bytes: not characters


@dataclass
class MarkupCount:
    """Text characters (whitespace not counted, an entity one) and elements of markup fed a
    chunk at a time, without building anything: a tag cut by a chunk's end waits in
    ``pending`` for the next one. Refused (DocumentError, 413) as soon as either passes its
    limit."""

    what: str
    max_chars: int
    max_elements: int
    characters: int = 0
    elements: int = 0
    pending: bytes = b""

    def feed(self, chunk: bytes) -> None:
        data = self.pending + chunk if self.pending else chunk
        cut = data.rfind(b"<")
        if cut > data.rfind(b">"):
            data, self.pending = data[:cut], data[cut:]
            if len(self.pending) > MAX_TAG_BYTES:
                raise DocumentError(f"The {self.what} holds a tag longer than "
                                    f"{MAX_TAG_BYTES} bytes.", status=413)
        else:
            self.pending = b""
            # An entity cut by the chunk's end is one character, counted with the next chunk.
            amp = data.rfind(b"&")
            if amp > max(data.rfind(b";"), data.rfind(b">")) and len(data) - amp <= 14:
                data, self.pending = data[:amp], data[amp:]
        self.elements += data.count(b"<") - data.count(b"</")
        text = _SPACE.sub(b"", _ENTITY.sub(b"&", _TAG.sub(b"", data)))
        self.characters += len(text.translate(None, _CONTINUATION))
        if self.characters > self.max_chars:
            raise DocumentError(f"The {self.what} holds more than {self.max_chars} characters "
                                f"of text; at most {self.max_chars} (MAX_DOCUMENT_CHARS).",
                                status=413)
        if self.elements > self.max_elements:
            raise DocumentError(f"The {self.what} holds more than {self.max_elements} XML "
                                f"elements; at most {self.max_elements} (as many as "
                                "MAX_DOCUMENT_CHARS allows characters).", status=413)

    def end(self) -> None:
        """The end of one entry: a tag still open there is no tag."""
        self.pending = b""


def max_elements(max_chars: int) -> int:
    """The most XML elements a zipped document's markup entries may hold together."""
    return max(ELEMENTS_PER_CHAR * max_chars, MIN_ELEMENTS)


def check_zip(data: bytes, what: str, max_chars: int | None = None) -> None:
    """A zipped document that can be opened: not empty, a zip (an encrypted Office file is
    not), every entry inflating to no more than its header declares and all of them to a
    bounded size. The entries are inflated here a chunk at a time and their bytes counted,
    so a header that lies costs no memory: the parsers that read them next trust the
    headers, and Python's zipfile inflates a whole entry before it cuts it to its declared
    size. With ``max_chars`` (an upload's check), the markup entries' text characters and
    elements are counted as they inflate too (``MarkupCount``), so that a document over the
    character limit, or one of millions of empty elements, is refused before any parser
    builds its tree."""
    if not data:
        raise DocumentError(f"The {what} is empty (0 bytes).")
    if data[:8] == b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1":
        raise DocumentError(f"The {what} is encrypted (password-protected): save it without "
                            "a password.")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except zipfile.BadZipFile:
        raise DocumentError(f"The {what} is not a valid file (not a zip archive).") from None
    limit = min(MAX_UNPACKED_BYTES, MAX_ZIP_RATIO * len(data))
    if sum(entry.file_size for entry in entries) > limit:  # an honest bomb: nothing inflated
        raise _too_large(what, len(data))
    count = (None if max_chars is None else
             MarkupCount(what, max_chars, max_elements(max_chars)))
    unpacked = 0
    for entry in entries:
        markup = count if count is not None and _MARKUP_ENTRY.search(entry.filename) else None
        unpacked += _inflated_size(data, entry, what, limit - unpacked, markup)
        if markup is not None:
            markup.end()
    if unpacked > limit:
        raise _too_large(what, len(data))


def _inflated_size(data: bytes, entry: zipfile.ZipInfo, what: str, room: int,
                   markup: MarkupCount | None = None) -> int:
    """The bytes ``entry`` actually inflates to, counted a chunk at a time; refused once it
    passes its declared size or ``room`` (what the whole zip may still unpack to). Each
    chunk goes to ``markup`` when given."""
    start = entry.header_offset + _LOCAL_HEADER.size
    header = data[entry.header_offset:start]
    if len(header) < _LOCAL_HEADER.size or not header.startswith(b"PK\x03\x04"):
        raise DocumentError(f"The {what} is not a valid file (entry {entry.filename!r}).")
    name_length, extra_length = _LOCAL_HEADER.unpack(header)[1:]
    start += name_length + extra_length
    packed = memoryview(data)[start:start + entry.compress_size]
    if entry.compress_type == zipfile.ZIP_STORED:
        size = len(packed)
        for at in range(0, size if markup is not None and size <= room else 0, _CHUNK):
            markup.feed(bytes(packed[at:at + _CHUNK]))  # type: ignore[union-attr]
    elif entry.compress_type == zipfile.ZIP_DEFLATED:
        inflater, size = zlib.decompressobj(-zlib.MAX_WBITS), 0
        try:
            pending = bytes(packed)
            while pending and not inflater.eof and size <= min(entry.file_size, room):
                chunk = inflater.decompress(pending, _CHUNK)
                size += len(chunk)
                pending = inflater.unconsumed_tail
                if markup is not None:
                    markup.feed(chunk)
        except zlib.error:
            raise DocumentError(f"The {what} is not a valid file (entry {entry.filename!r} "
                                "cannot be inflated).") from None
    else:
        raise DocumentError(f"The {what} uses a compression its format does not (entry "
                            f"{entry.filename!r}): save it again with its own application.")
    if size > room:
        raise _too_large(what, len(data))
    if size != entry.file_size:
        raise DocumentError(f"The {what} is not a valid file: entry {entry.filename!r} "
                            f"inflates to {'more' if size > entry.file_size else 'less'} than "
                            f"the {entry.file_size} bytes its header declares.")
    return size


def _too_large(what: str, packed: int) -> DocumentError:
    if MAX_ZIP_RATIO * packed < MAX_UNPACKED_BYTES:
        return DocumentError(f"The {what} unpacks to more than {MAX_ZIP_RATIO} times its "
                             f"{packed} bytes: refused as a zip bomb.")
    return DocumentError(f"The {what} unpacks to more than {MAX_UNPACKED_BYTES} bytes, the "
                         "most a document may hold unpacked.", status=413)


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

