"""The Translator as a Python API: one object, one call, the service's text pipeline."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.scheduler import ShuttingDown
from service.translator import InvalidOption, TranslateOptions, Translator
from training.corpus import read_tsv

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"
PAIRS = read_tsv(FIXTURE)[:16]  # the tiny model has learned these by heart


@pytest.fixture(scope="module")
def translator(tiny_bundle: Path) -> Iterator[Translator]:
    with Translator.open(tiny_bundle, device="cpu", threads=1, workers=1) as translator:
        yield translator


def test_translates_texts_as_the_service_does(translator: Translator) -> None:
    (s1, t1), (s2, t2), (s3, t3) = PAIRS[:3]
    results = translator.translate_batch([s1, f"{s2} {s3}\n\n{s1}", ""])
    assert [r.text for r in results] == [t1, f"{t2} {t3}\n\n{t1}", ""]
    # The default pair is the only one loaded; naming it changes nothing.
    assert translator.translate_batch([s1], ("EN", "de"))[0].text == t1


def test_options_as_an_object_or_as_keywords(translator: Translator) -> None:
    source, target = PAIRS[0]
    by_object = translator.translate_batch(
        [source], options=TranslateOptions(beam_size=4, num_alternatives=2, return_scores=True))
    by_keywords = translator.translate_batch([source], beam_size=4, num_alternatives=2,
                                             return_scores=True)
    assert by_object == by_keywords
    best = by_object[0]
    assert best.text == target
    assert best.score is not None and math.isfinite(best.score) and best.score <= 0
    assert best.alternatives and len(best.alternatives) <= 2
    assert all(text != target for text, _ in best.alternatives)


def test_more_texts_than_one_request_may_hold(tiny_bundle: Path) -> None:
    # 16 texts, 4 sentences a request and 8 in the queue: four requests, two at a time.
    with Translator.open(tiny_bundle, device="cpu", threads=1, workers=1,
                         max_request_sentences=4, max_queue=8) as translator:
        results = translator.translate_batch([s for s, _ in PAIRS])
    assert [r.text for r in results] == [t for _, t in PAIRS]


def test_bad_calls_are_refused_with_the_reason(translator: Translator) -> None:
    with pytest.raises(InvalidOption) as refused:
        translator.translate_batch(["a"], beam_size=99)
    assert refused.value.field == "beam_size"
    with pytest.raises(InvalidOption) as refused:
        translator.translate_batch(["a"], length_penalty=math.nan)
    assert refused.value.field == "length_penalty"
    with pytest.raises(ValueError, match="no model for en-fr"):
        translator.translate_batch(["a"], ("en", "fr"))
    with pytest.raises(TypeError, match="list"):
        translator.translate_batch("a text, not a list")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        translator.translate_batch(["a"], beam_width=2)  # not an option


def test_a_closed_translator_refuses_work(tiny_bundle: Path) -> None:
    translator = Translator.open(tiny_bundle, device="cpu", threads=1, workers=1)
    assert translator.translate_batch([PAIRS[0][0]])[0].text == PAIRS[0][1]
    translator.close()
    with pytest.raises(ShuttingDown):
        translator.translate_batch([PAIRS[0][0]])


def test_large_html_is_parsed_and_rebuilt_off_the_event_loop(
        translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large document's markup is parsed and rendered in a worker thread: on the event loop
    it would stall every other request and the health probes for as long (50,000 characters
    of HTML took 1.2 s). A small one stays on the loop, where a thread hop would cost more."""
    import threading

    from service import markup

    threads: list[str] = []
    parse = markup.parse

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return parse(*args, **kwargs)

    monkeypatch.setattr(markup, "parse", recording)
    source = PAIRS[0][0]
    small = translator.translate_batch([f"<p>{source}</p>"], format="html")
    assert small[0].text == f"<p>{PAIRS[0][1]}</p>"
    large = "".join(f"<p><b>{i}</b> {source}</p>" for i in range(100))
    assert len(large) > 2000
    translator.translate_batch([large], format="html")
    assert threads[0] == "translator-loop"  # the loop translate_batch runs on
    assert threads[1] != "translator-loop"


def test_a_pair_two_bundles_serve_through_english_is_two_legs(tiny_bundle: Path,
                                                             tmp_path: Path) -> None:
    """Bundles X->en and en->Y serve X->Y as two legs, exactly as translating twice by hand,
    markup and untranslatables through both. (The tiny model, copied as an fr-en bundle.)"""
    import json
    import shutil

    models = tmp_path / "models"
    shutil.copytree(tiny_bundle, models / "en-de")
    shutil.copytree(tiny_bundle, models / "fr-en")
    manifest = json.loads((models / "fr-en" / "manifest.json").read_text())
    manifest.update(source_lang="fr", target_lang="en")
    (models / "fr-en" / "manifest.json").write_text(json.dumps(manifest))
    source = PAIRS[0][0]
    with Translator.open(models, device="cpu", threads=1, workers=1) as translator:
        assert translator.pivots == {("fr", "de"): "en"}
        middle = translator.translate_batch([source], ("fr", "en"))[0].text
        by_hand = translator.translate_batch([middle], ("en", "de"))[0].text
        assert translator.translate_batch([source], ("fr", "de"))[0].text == by_hand
        html = f'<p><a href="https://example.org/a">{source}</a> https://example.org/b</p>'
        pivoted = translator.translate_batch([html], ("fr", "de"), format="html")[0].text
        # Whatever the tiny model makes of the words: the tags, their attributes and the URL
        # come back once each, in order.
        assert pivoted.startswith('<p><a href="https://example.org/a">')
        assert pivoted.endswith("</p>") and pivoted.count("</a>") == 1
        assert pivoted.count("https://example.org/b") == 1
