"""Numbers written as words: read in a source and a translation, and kept by the service."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from service.number_words import number_values

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("text", "lang", "values"), [
    ("The film starts in thirty minutes.", "en", {30}),
    ("She is thirty-five, he is thirty five.", "en", {35}),
    ("Der Film beginnt in dreiunddreißig Minuten.", "de", {33}),
    ("Zwölf Äpfel und zwei Birnen", "de", {12, 2}),
    ("Il a vingt ans.", "fr", {20}),
    # "one" / "eine" are articles as often as numbers; ordinals and words inside words are not
    ("I have one sister, the second one, often.", "en", set()),
    ("Ich habe eine Schwester.", "de", set()),
    ("seventy", "xx", set()),  # a language num2words does not write: not checked
    ("三十", "ja", set()),  # nor one written without spaces
])
def test_number_words_are_read_as_their_values(text, lang, values):
    assert number_values(text, lang) == values


def test_the_default_model_keeps_every_number_written_as_words() -> None:
    """The number probes, as served: "The film starts in thirty minutes." came out with
    "dreiunddreißig" from the model's first hypothesis; the service takes the first of a wider
    beam's hypotheses that keeps the source's number."""
    from service.translator import Translator

    with (ROOT / "configs" / "probes" / "en-de.tsv").open(encoding="utf-8") as probes:
        sources = [row[1] for row in csv.reader(probes, delimiter="\t")
                   if row and row[0] == "numbers-as-words"]
    with Translator.open(ROOT / "models" / "en-de", device="cpu", threads=1,
                         workers=1) as translator:
        results = translator.translate_batch(sources)
    for source, result in zip(sources, results, strict=True):
        assert number_values(source, "en") <= number_values(result.text, "de"), (source,
                                                                                  result.text)
        assert not any(char.isdigit() for char in result.text), result.text


def test_the_default_model_keeps_digits_inside_words_and_upper_case_words() -> None:
    """Digits inside a word travel without a marker, and the model's first hypothesis drops
    some ("libwnck22" as "libwnck2", "4x4" as "4"); the service takes the first of a wider
    beam's hypotheses that holds them all."""
    from service.translator import Translator

    sources = ["This package contains documentation files for libwnck22.",
               "WindowMaker dock app 4x4 puzzle",
               # Upper-case words likewise: the first hypotheses have "Namensraum-ID" and
               # "NETWORKTAYS".
               "Invalid namespace PID", "=NETWORKDAYS(C3;D3;F3:J3) returns 17 workdays."]
    with Translator.open(ROOT / "models" / "en-de", device="cpu", threads=1,
                         workers=1) as translator:
        results = [result.text for result in translator.translate_batch(sources)]
    assert "libwnck22" in results[0] and "4x4" in results[1], results
    assert "-PID" in results[2] and "=NETWORKDAYS(C3;D3;F3:J3)" in results[3], results


def test_acronyms_are_asked_for_only_in_the_same_script_and_not_when_shouted() -> None:
    """Russian writes "NASA" as "НАСА", and English "США" as "USA": only digits must come
    through there; "DO NOT TOUCH THE CABLE" is shouting, and translated."""
    from service.passes import _latin, _verbatim

    assert _verbatim("NASA launched 3 rockets.", source=True,
                     names=_latin("НАСА запустило 3 ракеты.")) == {"3": 1}
    assert _verbatim("США и NATO", source=True, names=_latin("USA and NATO")) == {"NATO": 1}
    assert _verbatim("DO NOT TOUCH THE CABLE 2", source=True) == {"2": 1}
    assert _verbatim("Invalid namespace PID", source=True) == {"PID": 1}
    # Names with a capital inside are asked for too; an inflected acronym holds its stem.
    assert _verbatim("the {0} ImageMap Editor", source=True) == {"ImageMap": 1}
    assert _verbatim("die Einstellungen des PCs") == {"PC": 1}


def test_a_model_that_writes_its_own_acronym_is_trusted_with_them() -> None:
    """Spanish "OTAN" for "NATO" is a translation; "ID" for "PID" and "NETWORKTAYS" for
    "NETWORKDAYS" are mangled copies, which the wider beam is asked to mend."""
    from service.passes import _own_acronym

    assert _own_acronym("NATO and AIDS", "OTAN y SIDA")
    assert _own_acronym("the EU", "l'UE")
    assert not _own_acronym("Invalid namespace PID", "Ungültiger Namensraum-ID")
    assert not _own_acronym("=NETWORKDAYS(A1)", "=NETWORKTAYS(A1)")
    assert not _own_acronym("the EU", "die EU")
