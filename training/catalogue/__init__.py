"""The model catalogue: ``translate-models`` lists, installs and removes the models Argos
Translate's package index and Helsinki-NLP's Opus-MT repositories publish, as bundles in
MODEL_DIR.

Installing imports the model (``training.importers``, so it needs the train extra: torch),
which is why the command lives here and not in ``service/``; ``list`` and ``remove`` read and
delete bundles only. Modules: ``download`` (resumable, verified HTTP downloads), ``argos``
(the package index and its packages), ``opus`` (the hub), ``install`` (lock, import, probe,
atomic move), ``cli``.
"""

from __future__ import annotations

import re

# A pair as MODEL_DIR names its bundle: source and target language codes, e.g. en-de, pt_BR-en.
_PAIR = re.compile(r"^([A-Za-z]{2,3}(?:_[A-Za-z]+)?)-([A-Za-z]{2,3}(?:_[A-Za-z]+)?)$")


class CatalogueError(RuntimeError):
    """An install, listing or removal that cannot go on; its message is one line naming the
    pair, the URL and the cause."""


def parse_pair(text: str) -> tuple[str, str]:
    """(source, target) of ``en-de``; a ``CatalogueError`` for anything else."""
    match = _PAIR.match(text.strip())
    if not match:
        raise CatalogueError(f"{text!r} is not a language pair (expected e.g. en-de)")
    return match.group(1), match.group(2)
