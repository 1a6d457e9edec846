"""The numbers/names/URLs measure: what counts as an item, when it is expected, when kept."""

from __future__ import annotations

from collections import Counter

from training.verbatim import verbatim_items, verbatim_retention


def test_items_are_digit_runs_capitalised_words_and_urls():
    items = verbatim_items("Kate's 2 PDFs from https://example.org/a1/Report, at 10:30 in NFS.")
    assert items["urls"] == Counter(["https://example.org/a1/Report"])  # without the comma
    # Digits and words inside the URL count only as the URL; "s" and lower-case words never.
    assert items["numbers"] == Counter(["2", "10", "30"])
    assert items["names"] == Counter(["Kate", "PDFs", "NFS"])


def test_numbers_match_across_decimal_conventions():
    assert verbatim_items("1,234.5 km")["numbers"] == verbatim_items("1.234,5 km")["numbers"]


def test_only_items_the_reference_keeps_are_expected():
    result = verbatim_retention(
        ["The train to Munich is 20 minutes late.", "Save File As"],
        ["Der Zug nach München hat 20 Minuten Verspätung.", "Datei speichern unter"],
        ["Der Zug 200 Mich ist 1 Minuten.", "Datei speichern unter"],
    )
    # "Munich" became "München" in the reference, "The", "Save", "File", "As" were translated:
    # nothing is expected of the names; "20" is expected and the hypothesis lost it ("200").
    assert result["names"] == {"sentences": 0, "expected": 0, "kept": 0, "rate": None}
    assert result["numbers"] == {"sentences": 1, "expected": 1, "kept": 0, "rate": 0.0}
    assert result["urls"]["expected"] == 0


def test_repeated_items_count_as_often_as_expected_and_kept():
    result = verbatim_retention(
        ["Version 2 of Firefox needs 2 GB; see www.mozilla.org.", "Ask Anna and Anna."],
        ["Version 2 von Firefox braucht 2 GB; siehe www.mozilla.org.", "Frag Anna und Anna."],
        ["Firefox 2 braucht 2 2 GB (www.mozilla.org).", "Frag Anna."],
    )
    # Numbers: "2" twice expected, the hypothesis has it three times: 2 of 2 kept.
    assert result["numbers"] == {"sentences": 1, "expected": 2, "kept": 2, "rate": 100.0}
    # Names: Version, Firefox, GB, Anna x2 expected; Version and one Anna lost.
    assert result["names"] == {"sentences": 2, "expected": 5, "kept": 3, "rate": 60.0}
    assert result["urls"] == {"sentences": 1, "expected": 1, "kept": 1, "rate": 100.0}
