"""Gettext catalogues (``.po``, ``.pot``), read and written with polib: each untranslated
message and its plural translated, marked fuzzy for a human to review; messages already
translated, the header, contexts, comments and flags kept."""

from __future__ import annotations

import re

import polib

from service.documents.errors import DocumentError

_CHARSET = re.compile(r"charset=[^;\s]*", re.IGNORECASE)


def read_po(text: str) -> tuple[polib.POFile, list[str]]:
    """A catalogue and the texts to translate: each untranslated message's msgid (and its
    msgid_plural, after it)."""
    try:
        catalogue = polib.pofile(text)
    except (OSError, ValueError) as exc:
        raise DocumentError(f"The catalogue cannot be read: {exc}") from None
    texts = []
    for entry in _untranslated(catalogue):
        texts.append(entry.msgid)
        if entry.msgid_plural:
            texts.append(entry.msgid_plural)
    return catalogue, texts


def _untranslated(catalogue: polib.POFile) -> list[polib.POEntry]:
    return [entry for entry in catalogue if not entry.obsolete and entry.msgid
            and not entry.translated() and "fuzzy" not in entry.flags]


def write_po(catalogue: polib.POFile, translations: list[str]) -> str:
    """The catalogue with the translations in (plural forms: every form after the first gets
    the plural's), each marked fuzzy, and its header's charset UTF-8, as the file is
    written (a catalogue that declared ASCII would no longer compile)."""
    given = iter(translations)
    for entry in _untranslated(catalogue):
        singular = next(given)
        if entry.msgid_plural:
            plural = next(given)
            forms = max(2, len(entry.msgstr_plural))
            entry.msgstr_plural = {0: singular, **dict.fromkeys(range(1, forms), plural)}
        else:
            entry.msgstr = singular
        entry.flags.append("fuzzy")
    if catalogue.metadata:  # the file is written as UTF-8: its header says so
        declared = catalogue.metadata.get("Content-Type", "text/plain; charset=UTF-8")
        catalogue.metadata["Content-Type"] = (
            _CHARSET.sub("charset=UTF-8", declared) if _CHARSET.search(declared)
            else declared + "; charset=UTF-8")
        catalogue.encoding = "utf-8"
    return str(catalogue)

