"""The peer tests that are expected to fail against this service, and why (scripts/peer-suites.sh).

scripts/peer/summarize.py puts each failing test of a peer suite in exactly one class:

  protocol             anything not listed here, and any listed test whose failure does not show
                       the entry's evidence: a disagreement with the API as the clients expect it.
                       This is what must be empty; the script exits 0 only when it is.
  unsupported feature  the test needs a feature that docs/api.md lists as not supported, and the
                       service refuses it or answers 404 (named by FEATURES below).
  pair not served      the test translates a pair other than EN->DE, the only pair served.
  model wording        the request and the answer's form are right, but the test compares the
                       text with DeepL's own translation (e.g. "Protonenstrahl", where our model
                       says "Protonbeam").

The classes come from this table, read from the tests' source, not from the failures' messages.
The messages only check it: an entry's ``evidence`` (regular expressions, all of which must be
found in the failure's message and traceback) confirms that the test failed for the reason
given; one that does not match makes the failure a protocol failure, as does a failing test not
in the table. A listed test that passes is reported ("listed as expected failure but passed") so
that the table is kept honest, and so is an entry that matched no test in the report.

Patterns are pytest node ids (file path relative to the suite's directory, ``::``, the test's
name with its parameters); ``*`` matches any run of characters and nothing else is special
(``[`` and ``]`` are literal). The first entry that matches a test is the one used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROTOCOL = "protocol"
UNSUPPORTED = "unsupported feature"
PAIR = "pair not served"
WORDING = "model wording"
CLASSES = (PROTOCOL, UNSUPPORTED, PAIR, WORDING)

# The unsupported features, in the order they are reported.
FORMALITY = "formality more/less"
REPHRASE = "rephrase/write"
STYLE_RULES = "style rules"
TRANSLATION_MEMORIES = "translation memories"
CUSTOM_INSTRUCTIONS = "custom instructions"
FEATURES = (FORMALITY, REPHRASE, STYLE_RULES,
            TRANSLATION_MEMORIES, CUSTOM_INSTRUCTIONS)

# Evidence. deepl-python words a 404 as "Not found, message: <body's message>" (or "Glossary not
# found, ..." on the glossary endpoints); a 400 as "Bad request, message: ...".
NOT_FOUND = r"[Nn]ot found, message: Not Found"
PAIR_REFUSED = r"Bad request, message: Value for '(source|target)_lang' not supported"
PROTON_BEAM = r"Protonenstrahl"


@dataclass(frozen=True)
class Expected:
    pattern: str
    cls: str
    reason: str
    feature: str = ""
    evidence: tuple[str, ...] = ()

    def matches(self, nodeid: str) -> bool:
        return _compile(self.pattern).fullmatch(nodeid) is not None

    def missing_evidence(self, text: str) -> list[str]:
        """The evidence patterns not found in TEXT (a failure's message and traceback)."""
        return [e for e in self.evidence if re.search(e, text) is None]


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _all(cls: str, reason: str, evidence: tuple[str, ...], nodeids: list[str],
         feature: str = "") -> list[Expected]:
    return [Expected(n, cls, reason, feature, evidence) for n in nodeids]


# ---- LibreTranslate's tests/test_api ---------------------------------------------------------
# All pass (the suite's "target": "es" is rewritten to "de" by the script).
LIBRETRANSLATE: list[Expected] = []

# ---- deepl-python 1.30.0's tests/ (real-server mode; the mock-server-only tests are skipped) ----
DEEPL_PYTHON: list[Expected] = [
    # -- (b) unsupported: formality more/less (refused: no model here has a formality setting) --
    Expected("tests/test_translate_text.py::test_formality", UNSUPPORTED,
             "formality=less/more for DE (docs/api.md: refused, 400)", FORMALITY,
             (r"does not support the 'formality' setting",)),
    Expected("tests/test_translate_document.py::test_translate_document_formality",
             UNSUPPORTED, "formality=more/less for a DE document (refused, 400, as for text)",
             FORMALITY, (r"does not support the 'formality' setting",)),
    Expected("tests/test_general.py::test_language", UNSUPPORTED,
             "expects /v2/languages?type=target to say DE supports_formality; it says false, "
             "as more/less are refused", FORMALITY, (r"supports_formality",)),
    # -- (b) unsupported: rephrase/write (/v2/write/rephrase): 404 --
    *_all(UNSUPPORTED, "DeepL Write; /v2/write/rephrase is not served (404)", (NOT_FOUND,),
          ["tests/test_rephrase_text.py::test_single_text",
           "tests/test_rephrase_text.py::test_business_style"], REPHRASE),
    # -- (b) unsupported: style rules (/v3/style_rules): 404 --
    *_all(UNSUPPORTED, "style rules; /v3/style_rules is not served (404)", (NOT_FOUND,),
          ["tests/test_style_rules.py::test_style_rule_crud",
           "tests/test_style_rules.py::test_style_rule_accepts_style_rule_info"], STYLE_RULES),
    # (test_style_rule_validation passes: the client checks its arguments before any request.)
    # -- (b) unsupported: translation memories --
    # These tests are all mock-server only, so skipped here; listed so that they are classed if
    # they are ever run against this service. (Other mock-server-only tests are not listed.)
    *_all(UNSUPPORTED, "translation memories (/v3/translation_memories) are not served",
          (NOT_FOUND,), ["tests/test_translation_memories.py::*"], TRANSLATION_MEMORIES),
    # -- (b) unsupported: custom instructions (refused, 400) --
    Expected("tests/test_translate_text.py::test_custom_instructions", UNSUPPORTED,
             "custom_instructions is refused (400): no model here takes instructions",
             CUSTOM_INSTRUCTIONS, (r"'custom_instructions' is not supported",)),

    # -- (c) pair not served: only EN->DE is --
    Expected("tests/test_general.py::test_example_translation[*]", PAIR,
             "translates 'proton beam' in each language (EN, EN-US, EN-GB included) to EN-US",
             evidence=(PAIR_REFUSED,)),
    Expected("tests/test_general.py::test_mixed_direction_text", PAIR,
             "translates to EN-US and to AR", evidence=(PAIR_REFUSED,)),
    *_all(PAIR, "creates DE->EN glossaries and translates DE to EN with them",
          (PAIR_REFUSED,), ["tests/test_glossary.py::test_glossary_translate_text_basic",
                            "tests/test_multilingual_glossary.py::"
                            "test_glossary_translate_text_basic"]),
    Expected("tests/test_translate_document.py::test_document_failure_during_translation",
             PAIR, "uploads German without source_lang for DE and expects DeepL's failure "
             "(source = target); with only EN->DE served, the source is taken as EN",
             evidence=(r"DID NOT RAISE",)),
    Expected("tests/test_translate_text.py::test_mixed_case_languages", PAIR,
             "translates DE to EN-US", evidence=(PAIR_REFUSED,)),
    Expected("tests/test_translate_text.py::test_context", PAIR,
             "translates DE to EN-US (context= is then not reached)", evidence=(PAIR_REFUSED,)),
    Expected("tests/test_translate_text.py::test_extra_body_params", PAIR,
             "extra_body_parameters overrides target_lang with FR", evidence=(PAIR_REFUSED,)),
    Expected("tests/test_translate_text.py::test_string_list", PAIR,
             "its first text is French, without source_lang: it is read as English and the "
             "answer compared with 'Protonenstrahl'", evidence=(r"assert 'Protonenstrahl' == '",)),

    # -- (d) model wording: the answer is compared with DeepL's translation --
    *_all(WORDING, "expects DeepL's 'Protonenstrahl' for 'proton beam' (ours: 'Protonbeam'); "
          "test_target_lang's later checks (target EN/PT refused as deprecated) are not reached",
          (PROTON_BEAM,), [f"tests/test_translate_text.py::{t}" for t in (
              "test_single_text", "test_string_generator", "test_source_lang",
              "test_target_lang")] + ["tests/test_general.py::test_translate_with_enums"]),
    *_all(WORDING, "a document's translation compared with DeepL's 'Protonenstrahl'",
          (PROTON_BEAM,), ["tests/test_cli.py::test_document",
                           "tests/test_translate_document.py::"
                           "test_translate_document_from_filepath",
                           "tests/test_translate_document.py::"
                           "test_translate_document_string"]),
    *_all(WORDING, "the CLI's `text`: expects DeepL's 'Protonenstrahl' in the output",
          (PROTON_BEAM,), [f"tests/test_cli.py::{t}" for t in (
              "test_text", "test_text_stdin", "test_text_preserve_formatting")]),
    Expected("tests/test_translate_text.py::test_tag_handling_xml", WORDING,
             "the <raw> check before it passes; then expects DeepL's 'Der Titel' inside <title>",
             evidence=(r"Der Titel", r"<title>[^<]*</title>")),
    Expected("tests/test_translate_text.py::test_tag_handling_html", WORDING,
             "expects DeepL's '<h1>Meine erste Überschrift</h1>'; the answer has the <h1> and "
             "the untranslated <p translate=\"no\"> right",
             evidence=(r"Meine erste Überschrift",
                       r'<h1>[^<]*</h1>(\\n|\s)*<p translate="no">My first paragraph\.</p>')),
]

EXPECTED: dict[str, list[Expected]] = {
    "libretranslate": LIBRETRANSLATE,
    "deepl-python": DEEPL_PYTHON,
}


def lookup(suite: str, nodeid: str) -> Expected | None:
    """The first entry of SUITE's table that matches NODEID, or None."""
    return next((e for e in EXPECTED.get(suite, []) if e.matches(nodeid)), None)
