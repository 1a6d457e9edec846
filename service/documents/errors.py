"""The one error a document raises: what is wrong with the upload, for a 400 (or 413)."""

from __future__ import annotations


class DocumentError(ValueError):
    """An upload that cannot be translated; ``field`` names the form field at fault."""

    def __init__(self, message: str, field: str = "file", status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status

    def __reduce__(self) -> tuple[type[DocumentError], tuple[str, str, int]]:
        # Raised in a worker process (service.documents.parsers), it crosses back whole.
        return type(self), (str(self), self.field, self.status)

