"""Source-language detection among the loaded bundles' languages (service/detect.py)."""

from __future__ import annotations

import pytest

from service.detect import LanguageDetector, model_label

ENGLISH = [
    "The meeting has been moved to Thursday afternoon.",
    "Could not connect to the server. Please try again later.",
    "She walked home through the park because the buses were not running.",
]
GERMAN = [
    "Die Besprechung wurde auf Donnerstagnachmittag verschoben.",
    "Verbindung zum Server fehlgeschlagen. Bitte versuchen Sie es später erneut.",
    "Sie ging zu Fuß durch den Park nach Hause, weil die Busse nicht fuhren.",
]


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector(["en", "de"])


@pytest.mark.parametrize(("text", "language"),
                         [*((t, "en") for t in ENGLISH), *((t, "de") for t in GERMAN)])
def test_sentences_are_detected(detector: LanguageDetector, text: str, language: str) -> None:
    best, confidence = detector.detect(text)[0]
    assert best == language
    assert confidence > 0.5


@pytest.mark.parametrize(("text", "language"), [
    ("Save file", "en"), ("Datei speichern", "de"), ("Passwort vergessen?", "de"),
    ("Forgot your password?", "en"), ("Zurück", "de"),
])
def test_short_ui_strings(detector: LanguageDetector, text: str, language: str) -> None:
    assert detector.detect(text)[0][0] == language


def test_a_language_not_loaded_is_never_answered(detector: LanguageDetector) -> None:
    answers = detector.detect("Le chat dort sur le canapé depuis ce matin.")
    assert {language for language, _ in answers} == {"en", "de"}
    # The confidences are the model's over every language it knows: French text scores low.
    assert all(confidence < 0.2 for _, confidence in answers)


def test_confidences_are_sorted_probabilities(detector: LanguageDetector) -> None:
    for text in [*ENGLISH, *GERMAN, "OK", "Abbrechen"]:
        confidences = [confidence for _, confidence in detector.detect(text)]
        assert confidences == sorted(confidences, reverse=True)
        assert all(0.0 <= confidence <= 1.0 for confidence in confidences)
        assert sum(confidences) <= 1.0 + 1e-6


@pytest.mark.parametrize("text", ["", "   \n", "42", "... ?!", "3.14 + 2 = 5.14"])
def test_text_without_letters_gives_no_answer(detector: LanguageDetector, text: str) -> None:
    assert detector.detect(text) == []


def test_languages_answered_as_the_bundles_spell_them() -> None:
    detector = LanguageDetector(["eng", "deu", "pt-BR"])
    assert detector.detect(GERMAN[0])[0][0] == "deu"
    assert detector.detect(ENGLISH[0])[0][0] == "eng"
    assert detector.detect("O relatório será enviado amanhã de manhã.")[0][0] == "pt-BR"


def test_language_codes_map_to_the_model_labels() -> None:
    assert [model_label(code) for code in ("de", "deu", "ger", "EN-US", "pt_BR", "ast")] == [
        "de", "de", "de", "en", "pt", "ast"]


def test_a_language_the_model_does_not_know_gets_zero() -> None:
    answers = dict(LanguageDetector(["en", "tlh"]).detect(ENGLISH[0]))
    assert answers["tlh"] == 0.0
    assert answers["en"] > 0.5


def test_at_least_one_language_is_needed() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LanguageDetector([])
