"""The Translator as a Python API: one object, one call, the service's text pipeline."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.scheduler import DeadlineExceeded, ShuttingDown
from service.settings import Settings
from service.text import split_sentences
from service.translator import InvalidOption, TranslateOptions, Translator
from tests.test_api import fake_factory, fake_models
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


def fake_translator(tmp_path: Path, **settings: object) -> Translator:
    """A Translator over ``FakeEngine`` (a sentence's translation is its words upper-cased)."""
    models = fake_models(tmp_path / "models", "en-de")
    return Translator.load(Settings(model_dir=models, cache_mb=0, **settings),  # type: ignore[arg-type]
                           fake_factory(step_s=0.001))


def long_text(paragraphs: int, sentences: int) -> str:
    return "\n\n".join(" ".join(f"Paragraph {p} sentence {s}." for s in range(sentences))
                        for p in range(paragraphs)) + "\n"


@pytest.mark.parametrize("background", [False, True])
def test_a_text_larger_than_one_request_is_cut_between_sentences(tmp_path: Path,
                                                                  background: bool) -> None:
    """A paragraph of more sentences than MAX_REQUEST_SENTENCES (a document's msgid, say) is
    work accepted: it is translated in parts and joined back, layout and all."""
    text = long_text(2, 30)  # 60 sentences, 4 to a request
    with fake_translator(tmp_path, max_request_sentences=4, max_queue=8) as translator:
        options = TranslateOptions(return_sentences=True)
        results = asyncio.run(translator.translate_many(
            [text, "Short one."], ("en", "de"), options, background=background))
    whole, short = results
    assert whole.text == text.upper() and short.text == "SHORT ONE."
    segmented = split_sentences(text)
    assert whole.sentences is not None and whole.separators is not None
    assert [s.text for s in whole.sentences] == [p.upper() for p in segmented.pieces]
    assert whole.separators == list(segmented.separators)


def test_accepted_work_waits_for_a_full_queue_instead_of_failing(tmp_path: Path) -> None:
    """A document's requests that meet a queue full of other documents' work wait their
    turn (interactive requests' room is not theirs: filling it holds no document)."""
    with fake_translator(tmp_path, max_request_sentences=4, max_queue=8) as translator:

        async def main() -> tuple[bool, list[str]]:
            interactive = [translator.scheduler.admit("en-de", 4) for _ in range(2)]
            texts = [result.text for result in await translator.translate_many(
                ["a b."], ("en", "de"), TranslateOptions(), background=True)]
            assert texts == ["A B."]
            for admission in interactive:
                translator.scheduler.release(admission)
            others = [translator.scheduler.admit("en-de", 4, background=True)
                      for _ in range(2)]  # all of the documents' room
            work = asyncio.ensure_future(translator.translate_many(
                [f"t{i} u. v{i} w." for i in range(6)], ("en", "de"), TranslateOptions(),
                background=True))
            await asyncio.sleep(0.3)
            waited = not work.done()
            for admission in others:
                translator.scheduler.release(admission)
            return waited, [result.text for result in await work]

        began = time.monotonic()
        waited, texts = asyncio.run(main())
    assert waited and texts == [f"T{i} U. V{i} W." for i in range(6)]
    assert time.monotonic() - began < 10


def test_work_for_a_request_waits_for_a_full_queue_until_its_deadline(tmp_path: Path) -> None:
    """The parts of a large HTML text serve a request with a deadline: they wait for room in
    a full queue until then, not for ever."""
    with fake_translator(tmp_path, max_request_sentences=4, max_queue=8) as translator:

        async def main() -> object:
            others = [translator.scheduler.admit("en-de", 4) for _ in range(2)]
            deadline = asyncio.get_running_loop().time() + 1.5
            outcome = (await asyncio.gather(translator.translate_many(
                ["a b. c d."] * 3, ("en", "de"), TranslateOptions(), deadline=deadline),
                return_exceptions=True))[0]
            for admission in others:
                translator.scheduler.release(admission)
            return outcome

        assert isinstance(asyncio.run(main()), DeadlineExceeded)
