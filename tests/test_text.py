"""Sentence splitting, reassembly and chunking: pure functions, no model needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.text import Segmented, chunk, estimate_sentences, split_long, split_sentences

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"


def words_plus_eos(text: str) -> int:
    # Stands in for the tokenizer: one token a word, plus EOS, as engine.tokenize counts.
    return len(text.split()) + 1


def sentences(text: str) -> list[str]:
    return list(split_sentences(text).pieces)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello world. How are you?", ["Hello world.", "How are you?"]),
        ("Stop! Go on? Yes.", ["Stop!", "Go on?", "Yes."]),
        ("One sentence only", ["One sentence only"]),
        ("Dr. Smith met Mr. Brown and Mrs. Green.", ["Dr. Smith met Mr. Brown and Mrs. Green."]),
        ("Use a tool, e.g. Python. It works.", ["Use a tool, e.g. Python.", "It works."]),
        ("That is, i.e. Berlin is big.", ["That is, i.e. Berlin is big."]),
        ("It costs 3.5 euros. Cheap.", ["It costs 3.5 euros.", "Cheap."]),
        ("Version 2.0.1 is out. Update now.", ["Version 2.0.1 is out.", "Update now."]),
        ("Wait... What happened?", ["Wait...", "What happened?"]),
        ("Wait… What happened?", ["Wait…", "What happened?"]),
        ("I think... maybe not.", ["I think... maybe not."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ('"Stop!" he shouted.', ['"Stop!" he shouted.']),
        ("He left (finally!) Then we ate.", ["He left (finally!)", "Then we ate."]),
        ('It ended. "Why?" she asked.', ["It ended.", '"Why?" she asked.']),
        ("J. R. R. Tolkien wrote it. Read it.", ["J. R. R. Tolkien wrote it.", "Read it."]),
        ("He lives in the U.S. and likes it.", ["He lives in the U.S. and likes it."]),
        ("See No. 5 on page 3. Then stop.", ["See No. 5 on page 3.", "Then stop."]),
        ("See Fig. 3 and pp. 10-12.", ["See Fig. 3 and pp. 10-12."]),
        ("It was the third. No one came.", ["It was the third.", "No one came."]),
        ("It happened on Jan. 5 at noon.", ["It happened on Jan. 5 at noon."]),
        ("Lower case after a dot. and more", ["Lower case after a dot. and more"]),
        ("Visit example.com today. Thanks.", ["Visit example.com today.", "Thanks."]),
        ("In 2020. 2021 was better.", ["In 2020.", "2021 was better."]),
        ("1. First item\n2. Second item", ["1. First item", "2. Second item"]),
        ("IV. Results are good.", ["IV. Results are good."]),
        ("Title without stop\nBody text here.", ["Title without stop", "Body text here."]),
        ("你好。世界！ 再见", ["你好。", "世界！", "再见"]),
    ],
)
def test_sentence_boundaries(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "\n\n\t ",
        "Plain.",
        "  Leading and trailing.  \n",
        "Para one. Still one.\n\nPara two.\r\n\r\nPara three!   Spaced.",
        "\tIndented line.\n\tAnother one.\n",
        "Line one\n\n\n\nafter many blank lines",
        "Mixed\u2028separator\u2029here.",
        "No break\u00a0space. Next one.",
    ],
)
def test_join_of_originals_restores_text_exactly(text: str) -> None:
    segmented = split_sentences(text)
    assert segmented.original == text
    assert all(piece == piece.strip() and piece for piece in segmented.pieces)


def test_columns_set_with_tabs_and_spaces_are_translated_apart_and_keep_their_gaps() -> None:
    text = "Usage: app [options]\n  -h, --help     Show this help.\nName\t\tValue"
    segmented = split_sentences(text)
    assert segmented.pieces == ("Usage: app [options]", "-h, --help", "Show this help.",
                                "Name", "Value")
    assert segmented.separators == ("", "\n  ", "     ", "\n", "\t\t", "")
    assert segmented.join(["A", "B", "C", "D", "E"]) == "A\n  B     C\nD\t\tE"
    assert estimate_sentences(text) >= len(segmented.pieces)
    # One space between words is a sentence's own.
    assert split_sentences("Show this help.").pieces == ("Show this help.",)


def test_whitespace_only_text_has_no_pieces() -> None:
    for text in ["", "   ", "\n\n", " \t\r\n "]:
        segmented = split_sentences(text)
        assert segmented.pieces == ()
        assert segmented.join([]) == text


def test_join_puts_translations_between_original_separators() -> None:
    text = "  Hello there. How are you?\n\nFine, thanks.  \n"
    segmented = split_sentences(text)
    assert segmented.pieces == ("Hello there.", "How are you?", "Fine, thanks.")
    joined = segmented.join(["Hallo.", "Wie geht's?", "Gut, danke."])
    assert joined == "  Hallo. Wie geht's?\n\nGut, danke.  \n"


def test_join_checks_count() -> None:
    with pytest.raises(ValueError):
        split_sentences("One. Two.").join(["Eins."])


def test_segmented_needs_one_more_separator() -> None:
    with pytest.raises(ValueError):
        Segmented(("a",), ("",))


def test_chunk_keeps_every_word_and_fits() -> None:
    sentence = " ".join(f"w{i}" for i in range(50))
    result = chunk(sentence, 8, words_plus_eos)
    assert result.original == sentence
    assert all(words_plus_eos(piece) <= 8 for piece in result.pieces)
    assert len(result.pieces) == 8  # 7 words a piece: 50 words need 8 pieces


def test_chunk_prefers_clause_boundary() -> None:
    sentence = "alpha beta gamma delta, epsilon zeta eta theta iota kappa"
    result = chunk(sentence, 6, words_plus_eos)
    assert result.pieces[0] == "alpha beta gamma delta,"
    assert result.original == sentence


def test_chunk_keeps_odd_inner_whitespace() -> None:
    sentence = "a  b\tc   d e"
    result = chunk(sentence, 3, words_plus_eos)
    assert result.pieces == ("a  b", "c   d", "e")
    assert result.original == sentence


def test_chunk_splits_a_word_longer_than_the_model() -> None:
    def chars_plus_eos(text: str) -> int:
        return len(text) + 1

    sentence = "short " + "x" * 25 + " end"
    result = chunk(sentence, 11, chars_plus_eos)
    assert result.original == sentence
    assert all(chars_plus_eos(piece) <= 11 for piece in result.pieces)
    assert result.pieces[1:4] == ("x" * 10, "x" * 10, "x" * 5)


def test_chunk_refuses_a_limit_that_cannot_hold_a_character() -> None:
    with pytest.raises(ValueError):
        chunk("abc", 1, lambda text: len(text) + 1)


def test_split_long_only_touches_long_pieces() -> None:
    text = "Short one.\n\n" + " ".join(["word"] * 30) + ".  Short again."
    segmented = split_long(split_sentences(text), 10, words_plus_eos)
    assert segmented.original == text
    assert segmented.pieces[0] == "Short one."
    assert segmented.pieces[-1] == "Short again."
    assert len(segmented.pieces) == 2 + 4  # 30 words at 9 a piece
    assert all(words_plus_eos(piece) <= 10 for piece in segmented.pieces)
    assert segmented.separators[1] == "\n\n"
    assert segmented.separators[-2] == "  "


def test_split_long_on_empty_text() -> None:
    segmented = split_long(split_sentences("  "), 10, words_plus_eos)
    assert segmented.pieces == ()
    assert segmented.original == "  "


def test_chunk_calls_the_counter_a_logarithmic_number_of_times() -> None:
    calls = 0

    def counting(text: str) -> int:
        nonlocal calls
        calls += 1
        return words_plus_eos(text)

    chunk(" ".join(["w"] * 1000), 101, counting)
    assert calls < 10 * 20  # 10 pieces, a binary search each


def test_the_sentence_estimate_is_not_below_the_split() -> None:
    texts = [
        "",
        "  \n ",
        "Hello world.",
        'Mr. Smith went. He said: "Hi." Then\nleft',
        "First para.\n\n  Second one! Third?\tFourth…",
        "第一。第二！第三",
        "line\u2028break and e.g. this. And i.e. that.",
        "1. one\n2. two\nIV. Results",
        *FIXTURE.read_text(encoding="utf-8").splitlines(),
    ]
    for text in texts:
        assert estimate_sentences(text) >= len(split_sentences(text).pieces), repr(text)
    assert estimate_sentences("One. Two. Three.") == 3
    assert estimate_sentences("  ") == 0


def test_pieces_without_a_letter_or_digit_are_kept_as_they_came() -> None:
    """The model rewrote "!!!" as "!!!!" and "???" as "?": a piece with nothing to translate
    stays in the layout."""
    only_marks = split_sentences("... !!! ???")
    assert only_marks.pieces == () and only_marks.original == "... !!! ???"
    text = "Wait... !!! ??? Go on.\n🍕\n- Yes!\n—"
    mixed = split_sentences(text)
    assert mixed.pieces == ("Wait...", "Go on.", "- Yes!")
    assert mixed.original == text
