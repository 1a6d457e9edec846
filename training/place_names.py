"""Training pairs with a place name swapped for one the target language names differently:
"a school visit to London" / "mit der Schule nach London" also as "... to Vienna" / "... nach
Wien".

Why: a place the corpus names is almost always spelled alike in both languages (London,
Berlin, Paris), so the model learns to copy place names, and copies the ones German names
otherwise ("Vienna", "Munich": the model card's exonym probes). The names come from a
gazetteer, English -> target pairs (the recipe's ``place-names``: GNOME's weather locations
catalog, thousands of cities, regions and countries). A pair qualifies when its source names
one place of the gazetteer, after a preposition ("to London"), that the target spells alike
after one of its own ("nach London"); each copy puts a place in its stead whose target name
differs from the English one by more than accents ("Vienna" / "Wien", not "Kalamáta" /
"Kalamata"). Target names that take an article ("die Schweiz", "die Türkei") or hold a space
are left out: the sentence around them would need other words; so are names the corpus itself
does not use on both sides (the gazetteer's rarer and dated ones).
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from service.glossary import Terms

# Before a place: a preposition, or a verb of travel.
# ("of", "at", "for" are left out: "the University of Bath", "at Marshall", "for Jordan" name
# more than places.)
SOURCE_BEFORE = ("in", "to", "from", "near", "via", "around", "visit", "visited", "towards",
                 "outside")
TARGET_BEFORE = {
    "de": ("in", "nach", "aus", "von", "bei", "über", "um", "zu", "für", "besuchen", "besucht",
           "vor", "außerhalb", "Richtung"),
}
# German place names used with an article ("in die Schweiz", "im Irak", "auf den Malediven").
_WITH_ARTICLE = re.compile(r"ei$|[Ii]nseln$|[Ss]ahara$|^(?:Schweiz|Ukraine|Niederlande|Antarktis|"
                           r"Arktis|Karibik|Pfalz|Toskana|Normandie|Bretagne|Provence|Krim|"
                           r"Lausitz|Steiermark|Uckermark|Altmark|Ortenau|Wetterau|Eifel|Rhön|"
                           r"Atlantik|Pazifik|Libanon|Tschad|Irak|Iran|Jemen|Sudan|Kongo|Niger|"
                           r"Malediven|Seychellen|Philippinen|Komoren|Salomonen|Bahamas|"
                           r"Kapverden|Vereinigten Staaten|USA)$"
                          r"|\s(?:Republik|Emirate|Königreich)$")
_NAME = re.compile(r"[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*)*")


# Catalog entries that are not a place's own name: time zones, parts of a country.
_NOT_A_NAME = re.compile(r"\b(?:Time|Standard|Mainland|Station)\b")


def _plain(text: str) -> str:
    """``text`` without accents, hyphens or case: 'Kalamáta' and 'Kalamata', 'Nanning' and
    'Nan-ning' are one spelling."""
    return "".join(c for c in unicodedata.normalize("NFKD", text)
                   if not unicodedata.combining(c) and c not in "-' ").casefold()


class PlaceSwapper:
    """Swaps a copied place name for one with its own name in the target language."""

    def __init__(self, gazetteer: Iterable[tuple[str, str]], target_lang: str,
                 corpus: Iterable[tuple[str, str]] | None = None, min_count: int = 2):
        """``corpus``: when given, only exonyms whose English name occurs in its sources and
        whose target name in its targets, each ``min_count`` times, are swapped in: the
        gazetteer also holds names few would write (Argostólion) and a few that are dated or
        wrong (Palestina, El-Katar), which the corpus's own use of a name sorts out."""
        before = TARGET_BEFORE.get(target_lang)
        self.alike: set[str] = set()  # places spelled alike in both languages
        self.exonyms: list[tuple[str, str]] = []  # (English, target) that differ
        for english, target in gazetteer:
            if not (_NAME.fullmatch(english) and _NAME.fullmatch(target)) or \
                    _NOT_A_NAME.search(english):
                continue  # qualified names ("Hamilton (capital of Bermuda)"), lists, codes
            if english == target:
                if len(english) > 3:  # "Bath", "Nice" are words too; short ones more so
                    self.alike.add(english)
            elif (_plain(english) != _plain(target) and " " not in target
                  and not _WITH_ARTICLE.search(target)):
                self.exonyms.append((english, target))
        if corpus is not None:
            self.exonyms = _in_use(self.exonyms, corpus, min_count)
        self.exonyms.sort()
        self.active = bool(before and self.alike and self.exonyms)
        if not self.active:
            return
        names = _alternatives(self.alike)
        # Not followed by a capitalised word: "in Athens Software", "to Marshall Islands DB"
        # name a company or a file, not the place.
        self._source = re.compile(
            rf"\b(?:{'|'.join(SOURCE_BEFORE)}) ({names})(?![\w'’-])(?! [A-Z])")
        self._target = re.compile(rf"\b(?:{'|'.join(before)}) ({names})(?![\w'’-])")
        self._any = _whole_word(self.alike)

    def swap(self, source: str, target: str, draw: random.Random) -> tuple[str, str] | None:
        """The pair with its one place swapped for an exonym drawn by ``draw``, or None when
        it does not qualify."""
        if not self.active or "(" in source:
            return None  # "Hamilton (city in Canada)": catalogue templates, not sentences
        found = self._source.findall(source)
        if len(found) != 1 or len(self._any.findall(source)) != 1:
            return None
        place = found[0]
        if self._target.findall(target) != [place] or len(self._any.findall(target)) != 1:
            return None
        english, translated = self.exonyms[draw.randrange(len(self.exonyms))]
        return (self._any.sub(english, source, count=1),
                self._any.sub(translated, target, count=1))


def _in_use(exonyms: list[tuple[str, str]], corpus: Iterable[tuple[str, str]],
            min_count: int) -> list[tuple[str, str]]:
    """The exonyms whose English name the corpus's sources and whose target name its targets
    each use at least ``min_count`` times."""
    english, target = _whole_word(e for e, _ in exonyms), _whole_word(t for _, t in exonyms)
    seen_english: Counter[str] = Counter()
    seen_target: Counter[str] = Counter()
    for src, tgt in corpus:
        seen_english.update(english.findall(src))
        seen_target.update(target.findall(tgt))
    return [(e, t) for e, t in exonyms
            if seen_english[e] >= min_count and seen_target[t] >= min_count]


def _alternatives(names: Iterable[str]) -> str:
    """A regular-expression alternation of ``names``, the longest first ("New York" before
    "York")."""
    return "|".join(sorted(map(re.escape, names), key=len, reverse=True))


def _whole_word(names: Iterable[str]) -> re.Pattern:
    """Any of ``names`` standing alone, not inside a longer word or hyphenated name."""
    return re.compile(rf"(?<![\w'’-])({_alternatives(names)})(?![\w'’-])")


def exonym_terms(gazetteer: Iterable[tuple[str, str]], corpus: Iterable[tuple[str, str]],
                 min_count: int = 2, min_share: float = 0.8) -> list[tuple[str, str, int, float]]:
    """The gazetteer's exonyms that the corpus confirms, as (English, target, sentences,
    share): the English name stands alone in at least ``min_count`` of its sources (not
    inside a longer name, as ``service.glossary.Terms`` with ``names`` matches it) and the
    target name, inflected or not, in at least ``min_share`` of their targets. That leaves
    out names that are also people's ("Jordan", the Bible's river and king; "Georgia", a US
    state), a library's ("Cairo") and spellings the target language does not use ("Tokio"
    beside "Tokyo"). Names that take an article in the target ("die Schweiz") are left out:
    "in Switzerland" would come out "in Schweiz". Accents count here ("Zurich" / "Zürich")."""
    candidates: dict[str, set[str]] = {}
    for english, target in gazetteer:
        if (english != target and _NAME.fullmatch(english) and _NAME.fullmatch(target)
                and not _NOT_A_NAME.search(english) and not _WITH_ARTICLE.search(target)):
            candidates.setdefault(english, set()).add(target)
    if not candidates:
        return []
    standing = Terms({english: english for english in candidates}, names=True)
    targets = {english: [(name, re.compile(rf"(?<![\w'’-]){re.escape(name)}"))
                         for name in names] for english, names in candidates.items()}
    seen: Counter[str] = Counter()
    found: Counter[tuple[str, str]] = Counter()
    for source, target in corpus:
        for english in {english for *_, english in standing.find(source)}:
            seen[english] += 1
            for name, pattern in targets[english]:
                if pattern.search(target):
                    found[english, name] += 1
    terms = []
    for english, count in seen.items():
        if count < min_count:
            continue
        best = max(targets[english], key=lambda entry: found[english, entry[0]])[0]
        share = found[english, best] / count
        if share >= min_share:
            terms.append((english, best, count, round(share, 3)))
    return sorted(terms)


def write_bundle_terms(bundle: str | Path, terms: list[tuple[str, str, int, float]],
                       provenance: str) -> Path:
    """``terms`` as the bundle's ``terms.tsv``, named in its manifest with its checksum."""
    from service.bundle import MANIFEST, write_manifest

    directory = Path(bundle)
    path = directory / "terms.tsv"
    lines = [f"# {line}" for line in provenance.splitlines()]
    lines += [f"{english}\t{target}" for english, target, *_ in terms]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    manifest["terms"] = path.name
    write_manifest(directory, manifest, added=(path.name,))
    return path
