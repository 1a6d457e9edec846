"""Zipped documents (Office, OpenDocument, EPUB): checked before any parser opens them, and
written back with only the entries translated changed."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

from service.documents.errors import DocumentError

# A zipped document is refused when its entries inflate to more than this in all, or at a
# ratio to the upload above this (a zip bomb), before any parser opens it.
MAX_UNPACKED_BYTES, MAX_ZIP_RATIO = 200_000_000, 200
_CHUNK = 1 << 16  # inflated at most this much at a time while an entry is measured
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and extra field's lengths


def check_zip(data: bytes, what: str) -> None:
    """A zipped document that can be opened: not empty, a zip (an encrypted Office file is
    not), every entry inflating to no more than its header declares and all of them to a
    bounded size. The entries are inflated here a chunk at a time and their bytes counted,
    so a header that lies costs no memory: the parsers that read them next trust the
    headers, and Python's zipfile inflates a whole entry before it cuts it to its declared
    size."""
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
    unpacked = 0
    for entry in entries:
        unpacked += _inflated_size(data, entry, what, limit - unpacked)
    if unpacked > limit:
        raise _too_large(what, len(data))


def _inflated_size(data: bytes, entry: zipfile.ZipInfo, what: str, room: int) -> int:
    """The bytes ``entry`` actually inflates to, counted a chunk at a time; refused once it
    passes its declared size or ``room`` (what the whole zip may still unpack to)."""
    start = entry.header_offset + _LOCAL_HEADER.size
    header = data[entry.header_offset:start]
    if len(header) < _LOCAL_HEADER.size or not header.startswith(b"PK\x03\x04"):
        raise DocumentError(f"The {what} is not a valid file (entry {entry.filename!r}).")
    name_length, extra_length = _LOCAL_HEADER.unpack(header)[1:]
    start += name_length + extra_length
    packed = memoryview(data)[start:start + entry.compress_size]
    if entry.compress_type == zipfile.ZIP_STORED:
        size = len(packed)
    elif entry.compress_type == zipfile.ZIP_DEFLATED:
        inflater, size = zlib.decompressobj(-zlib.MAX_WBITS), 0
        try:
            pending = bytes(packed)
            while pending and not inflater.eof and size <= min(entry.file_size, room):
                size += len(inflater.decompress(pending, _CHUNK))
                pending = inflater.unconsumed_tail
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

