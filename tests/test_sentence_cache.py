"""The cache of translated sentences (service/sentence_cache.py)."""

from __future__ import annotations

import gc
import random
import sys
import threading
import tracemalloc
from dataclasses import fields, replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from service.bundle import load_bundle
from service.engine import Engine
from service.metrics import Metrics
from service.search import DecodeOptions, Hypothesis, Translation
from service.sentence_cache import SentenceCache, model_fingerprint, sentence_key
from service.settings import Settings

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"
MODEL = "0123456789abcdef"
PAIR = ("en", "de")
WORDS = ["▁Katze", "▁schläft", "▁auf", "▁dem", "▁Sofa", "▁Bahnhof", "▁Wetter", "▁heute", "."]


def translation_of(seed: int, hypotheses: int = 1, length: int = 12) -> Translation:
    """A translation shaped as the engine's, different for every seed."""
    rng = random.Random(seed)
    result = []
    for rank in range(hypotheses):
        ids = [rng.randrange(300, 8000) for _ in range(length)]
        tokens = [rng.choice(WORDS) + str(i) for i in ids]
        result.append(Hypothesis("".join(tokens).replace("▁", " ").strip(), ids, tokens,
                                 -0.1 * seed - rank, -1.5 * seed - rank, length + 1))
    return Translation(result)


def key_of(seed: int, options: DecodeOptions | None = None) -> tuple:
    return sentence_key(MODEL, PAIR, options or DecodeOptions(), [seed + 1000, 17, 2000, 3])


def one_entry_bytes(seed: int = 0) -> int:
    cache = SentenceCache(1 << 30)
    cache.put(key_of(seed), translation_of(seed))
    return cache.bytes


def test_least_recently_used_is_evicted_first() -> None:
    size = one_entry_bytes()
    cache = SentenceCache(3 * size + size // 2)  # room for three entries of this shape
    for seed in (0, 1, 2):
        cache.put(key_of(seed), translation_of(seed))
    assert cache.get(key_of(0)) == translation_of(0)  # 0 is now the most recently used
    cache.put(key_of(3), translation_of(3))
    assert cache.get(key_of(1)) is None
    assert [cache.get(key_of(seed)) for seed in (0, 2, 3)] == [
        translation_of(seed) for seed in (0, 2, 3)]
    assert len(cache) == 3


def test_memory_stays_within_the_budget() -> None:
    budget = 20 * one_entry_bytes()
    cache = SentenceCache(budget)
    rng = random.Random(0)
    for seed in range(500):
        cache.put(key_of(seed), translation_of(seed, rng.randint(1, 3), rng.randint(1, 40)))
        assert 0 < cache.bytes <= budget
    assert 5 < len(cache) < 60
    # Replacing an entry counts it once.
    before, entries = cache.bytes, len(cache)
    cache.put(key_of(499), translation_of(499, 3, 40))
    assert len(cache) == entries
    assert cache.bytes <= budget and cache.bytes >= before - budget


def test_an_entry_over_the_whole_budget_is_not_kept() -> None:
    cache = SentenceCache(one_entry_bytes() * 2)
    cache.put(key_of(1), translation_of(1))
    cache.put(key_of(2), translation_of(2, hypotheses=4, length=200))
    assert cache.get(key_of(2)) is None
    assert cache.get(key_of(1)) == translation_of(1)


def test_zero_disables_the_cache() -> None:
    cache = SentenceCache(0)
    assert not cache.enabled
    cache.put(key_of(1), translation_of(1))
    assert cache.get(key_of(1)) is None
    assert (len(cache), cache.bytes, cache.misses) == (0, 0, 1)


def test_cache_mb_setting() -> None:
    assert Settings().cache_mb > 0  # on by default
    assert Settings(cache_mb=0).cache_mb == 0
    with pytest.raises(ValidationError, match="cache_mb"):
        Settings(cache_mb=-1)


def test_the_key_holds_every_option_that_changes_the_output() -> None:
    base = DecodeOptions(beam_size=2)
    changed = {
        "beam_size": replace(base, beam_size=4),
        "length_penalty": replace(base, length_penalty=0.6),
        "max_length": replace(base, max_length=5),
        "max_length_ratio": replace(base, max_length_ratio=1.2),
        "num_hypotheses": replace(base, num_hypotheses=2),
        "no_repeat_ngram_size": replace(base, no_repeat_ngram_size=3),
        "digits_from_source": replace(base, digits_from_source=False),
    }
    assert set(changed) == {f.name for f in fields(DecodeOptions)}  # a new option joins here
    source = [5, 6, 7, 3]
    keys = [sentence_key(MODEL, PAIR, options, source) for options in [base, *changed.values()]]
    keys += [sentence_key("fedcba9876543210", PAIR, base, source),
             sentence_key(MODEL, ("en", "fr"), base, source),
             sentence_key(MODEL, PAIR, base, [5, 6, 8, 3])]
    assert len(set(keys)) == len(keys)
    assert sentence_key(MODEL, PAIR, DecodeOptions(beam_size=2), (5, 6, 7, 3)) == keys[0]


def test_the_model_fingerprint_tells_bundles_and_variants_apart(tiny_bundle: Path) -> None:
    manifest = load_bundle(tiny_bundle).manifest
    other = {**manifest, "files": {**manifest["files"], "encoder.onnx": "0" * 64}}
    prints = {model_fingerprint(manifest, "int8"), model_fingerprint(manifest, "fp32"),
              model_fingerprint(other, "int8")}
    assert len(prints) == 3
    assert model_fingerprint(dict(reversed(manifest.items())), "int8") == model_fingerprint(
        manifest, "int8")


def test_callers_cannot_change_what_the_cache_holds() -> None:
    cache = SentenceCache(1 << 20)
    given = translation_of(7, hypotheses=2)
    cache.put(key_of(7), given)
    given.hypotheses[0].token_ids.append(99)
    given.hypotheses.pop()
    got = cache.get(key_of(7))
    assert got == translation_of(7, hypotheses=2)
    got.hypotheses[0].tokens.clear()
    got.hypotheses[1].text = "changed"
    assert cache.get(key_of(7)) == translation_of(7, hypotheses=2)


def test_concurrent_gets_and_puts_keep_it_consistent() -> None:
    budget = 40 * one_entry_bytes()
    cache = SentenceCache(budget)
    gets = [0] * 8
    wrong: list[int] = []
    keys = [key_of(seed) for seed in range(120)]
    values = [translation_of(seed) for seed in range(120)]

    def work(worker: int) -> None:
        rng = random.Random(worker)
        for _ in range(6000):
            seed = rng.randrange(120)
            if rng.random() < 0.5:
                cache.put(keys[seed], values[seed])
            else:
                gets[worker] += 1
                found = cache.get(keys[seed])
                if found is not None and found != values[seed]:
                    wrong.append(seed)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong
    assert cache.hits + cache.misses == sum(gets)
    assert cache.hits > 0
    assert cache.bytes <= budget
    # The running count equals the entries' sizes counted afresh.
    recount = SentenceCache(1 << 30)
    for key, _ in list(cache._entries.items()):
        recount.put(key, cache.get(key))
    assert recount.bytes == cache.bytes
    assert len(recount) == len(cache)


def test_accounted_memory_matches_tracemalloc() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        cache = SentenceCache(1 << 30)
        before = tracemalloc.get_traced_memory()[0]
        for seed in range(3000):
            cache.put(key_of(seed, DecodeOptions(beam_size=2, num_hypotheses=1 + seed % 2)),
                      translation_of(seed, hypotheses=1 + seed % 2, length=5 + seed % 30))
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.85 < cache.bytes / traced < 1.15, (cache.bytes, traced)


def test_hits_misses_and_size_are_metrics() -> None:
    metrics = Metrics()
    cache = SentenceCache(1 << 20, metrics)
    cache.put(key_of(1), translation_of(1))
    cache.get(key_of(1))
    cache.get(key_of(1))
    cache.get(key_of(2))
    samples = {sample.name: sample.value
               for family in text_string_to_metric_families(metrics.render().decode())
               for sample in family.samples}
    assert samples["translate_sentence_cache_hits_total"] == 2
    assert samples["translate_sentence_cache_misses_total"] == 1
    assert samples["translate_sentence_cache_entries"] == 1
    assert samples["translate_sentence_cache_bytes"] == cache.bytes > 0


# -- a cached answer equals a computed one ------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_bundle: Path) -> Engine:
    return Engine(tiny_bundle, device="cpu", threads=1)


def sources() -> list[str]:
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    seen = [line.split("\t")[0] for line in lines[:20]]
    return [*seen, "Hello.", "Please close the window and the door of the garden.",
            "I have a dog, a cat and a small brother in Berlin.", "Yes."]


@pytest.mark.parametrize("options", [
    dict(beam_size=1), dict(beam_size=4, num_hypotheses=2),
    dict(beam_size=3, no_repeat_ngram_size=2, length_penalty=0.6),
])
def test_a_cached_answer_equals_a_computed_one(engine: Engine, options: dict) -> None:
    texts = sources()
    model = model_fingerprint(engine.bundle.manifest, engine.variant)
    decode = engine.options(**options)

    def key(text: str) -> tuple:
        return sentence_key(model, PAIR, decode, engine.tokenize(text))

    # Every second sentence translated alone and cached, as earlier requests would have.
    cache = SentenceCache(1 << 20)
    for text in texts[::2]:
        cache.put(key(text), engine.translate([text], **options)[0])
    # A request of all of them: the cached ones answered from the cache, the others translated
    # in one batch; the same as translating the request in one batch without any cache.
    found = {text: cache.get(key(text)) for text in texts}
    missing = [text for text in texts if found[text] is None]
    assert len(missing) == len(texts) // 2
    found.update(zip(missing, engine.translate(missing, **options), strict=True))
    assert [found[text] for text in texts] == engine.translate(texts, **options)
    # And a sentence cached from a batch equals it translated alone.
    batched = engine.translate(texts[1:6], **options)
    for text, translation in zip(texts[1:6], batched, strict=True):
        cache.put(key(text), translation)
        assert cache.get(key(text)) == engine.translate([text], **options)[0]
