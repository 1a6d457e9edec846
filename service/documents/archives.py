"""Zipped documents (Office, OpenDocument, EPUB): checked before any parser opens them, and
written back with only the entries translated changed."""

from __future__ import annotations

import io
import zipfile

from service.documents.errors import DocumentError

# A DOCX is a zip: refused when it would unpack to more than this, or at a ratio above this
# (a zip bomb), before python-docx opens it.
MAX_UNPACKED_BYTES, MAX_ZIP_RATIO = 200_000_000, 200


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

