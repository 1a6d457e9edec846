"""Languages as people read them: the English name of a language code, for the APIs that
list languages by name (LibreTranslate's and DeepL's ``/languages``)."""

from __future__ import annotations

# English names of the languages bundles commonly serve; any other code names itself.
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish",
    "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian",
    "fi": "Finnish", "fr": "French", "ga": "Irish", "he": "Hebrew", "hi": "Hindi",
    "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sv": "Swedish",
    "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}


def language_name(code: str) -> str:
    """The English name of ``code`` (``de`` -> ``German``), or the code for a language not
    in ``LANGUAGE_NAMES``."""
    return LANGUAGE_NAMES.get(code, code)
