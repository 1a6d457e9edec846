"""How often a translation carries over what must pass through unchanged: numbers, names, URLs.

A source sentence's *items* are its URLs, its numbers (maximal runs of digits, so "1,234.5" and
"1.234,5" hold the same items 1, 234 and 5 in either language) and its capitalised words
(letters only, at least two, the first upper-case: "Munich", "NFS", "Kate" of "Kate's"), digits
and words inside URLs counting only as the URL. An item is *expected* when the reference holds
it too, as often as both hold it: the reference shows it is carried over verbatim, which leaves
out names that are translated ("Munich" -> "München") and title-case words ("Save File As").
An expected item is *kept* when the hypothesis holds it as well, again counted as often as it is
expected at most. The rate is kept / expected over every sentence of a set, per kind of item.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

# Scheme URLs and bare www. hosts, up to whitespace, quotes and brackets; trailing sentence
# punctuation is not part of the URL.
_URL = re.compile(r"""(?:https?|ftp)://[^\s<>"'()\[\]{}]+|\bwww\.[^\s<>"'()\[\]{}]+""",
                  re.IGNORECASE)
_URL_TAIL = ".,;:!?"
_NUMBER = re.compile(r"\d+")
WORD = re.compile(r"[^\W\d_]+")  # letters only: "NFS-Client" holds "NFS" and "Client"

KINDS = ("numbers", "names", "urls")


def is_name(word: str) -> bool:
    """A capitalised word of at least two letters (``word`` as ``WORD`` finds it)."""
    return len(word) >= 2 and word[0].isupper()


def verbatim_items(text: str) -> dict[str, Counter[str]]:
    """The URLs, numbers and capitalised words of ``text``, each kind as a multiset."""
    urls = [match.rstrip(_URL_TAIL) for match in _URL.findall(text)]
    rest = _URL.sub(" ", text)
    names = [w for w in WORD.findall(rest) if is_name(w)]
    return {"numbers": Counter(_NUMBER.findall(rest)), "names": Counter(names),
            "urls": Counter(urls)}


def verbatim_retention(sources: Iterable[str], references: Iterable[str],
                       hypotheses: Iterable[str]) -> dict[str, dict[str, float | int]]:
    """Per kind: ``sentences`` (those with at least one expected item), ``expected`` and
    ``kept`` items, and ``rate`` (kept / expected, in percent; None when nothing is expected)."""
    totals = {kind: {"sentences": 0, "expected": 0, "kept": 0} for kind in KINDS}
    for source, reference, hypothesis in zip(sources, references, hypotheses, strict=True):
        src, ref, hyp = (verbatim_items(text) for text in (source, reference, hypothesis))
        for kind in KINDS:
            expected = src[kind] & ref[kind]
            if not expected:
                continue
            total = totals[kind]
            total["sentences"] += 1
            total["expected"] += sum(expected.values())
            total["kept"] += sum((expected & hyp[kind]).values())
    return {kind: {**total, "rate": round(100 * total["kept"] / total["expected"], 2)
                   if total["expected"] else None}
            for kind, total in totals.items()}
