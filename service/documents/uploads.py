"""An upload read from a multipart/form-data body (the standard library's email parser), and a
text document's bytes read as UTF-8 (a byte-order mark allowed) within the character limit."""

from __future__ import annotations

import email.parser
import email.policy
from dataclasses import dataclass

from service.documents.errors import DocumentError


@dataclass
class Upload:
    filename: str
    data: bytes
    fields: dict[str, str]


def read_upload(body: bytes, content_type: str, file_field: str = "file") -> Upload:
    """The file and the other fields of a multipart/form-data body."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise DocumentError("Send the document as multipart/form-data, in a field named "
                            f"'{file_field}'.", file_field)
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise DocumentError("The multipart/form-data body cannot be read.", file_field)
    fields: dict[str, str] = {}
    upload: Upload | None = None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        payload = part.get_payload(decode=True) or b""
        if name == file_field:
            upload = Upload(part.get_filename() or "", payload, fields)
        else:
            fields[str(name)] = payload.decode("utf-8", errors="replace")
    if upload is None:
        raise DocumentError(f"No file: send it in the field '{file_field}'.", file_field)
    return upload



def document_text(data: bytes, max_chars: int) -> str:
    if not data:
        raise DocumentError("The file is empty.")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"The file is not UTF-8 text (byte {exc.start}).") from None
    if len(text) > max_chars:
        raise DocumentError(f"The document has {len(text)} characters; at most {max_chars} "
                            "(MAX_DOCUMENT_CHARS).", status=413)
    return text

