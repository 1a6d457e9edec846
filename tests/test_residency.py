"""Many pairs served lazily within MODEL_MEMORY_MB (service.residency): loaded on the first
request, once however many ask at once, off the event loop, the least recently used unloaded
for room; PRELOAD and /ready. The tiny model, copied as several pairs' bundles."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest

from service.api import deepl, libretranslate
from service.bundle import load_bundle
from service.engine import Engine
from service.loading import default_engine
from service.main import create_app
from service.metrics import Metrics
from service.residency import graph_megabytes
from service.scheduler import Scheduler
from service.search import DecodeOptions
from service.settings import Settings
from service.translator import TranslateOptions, Translator
from tests.test_api import serving
from tests.test_scheduler import FakeEngine
from training.corpus import read_tsv

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"
PAIRS = read_tsv(FIXTURE)[:16]  # the tiny model has learned these by heart
ONE_THREAD = {"device": "cpu", "threads": 1, "workers": 1, "cache_mb": 0}


@pytest.fixture(scope="module")
def models(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as the bundles en-de and fr-en (which translates as en-de does)."""
    root = tmp_path_factory.mktemp("lazy") / "models"
    shutil.copytree(tiny_bundle, root / "en-de")
    shutil.copytree(tiny_bundle, root / "fr-en")
    manifest = json.loads((root / "fr-en" / "manifest.json").read_text())
    manifest.update(source_lang="fr", target_lang="en")
    (root / "fr-en" / "manifest.json").write_text(json.dumps(manifest))
    return root


def model_mb(models: Path) -> float:
    return graph_megabytes(load_bundle(models / "en-de"), None)


def count(metrics: Metrics, name: str, model: str | None = None) -> float:
    labels = {"model": model} if model else {}
    return metrics.registry.get_sample_value(name, labels) or 0.0


def total(metrics: Metrics, name: str) -> float:
    return sum(sample.value for family in metrics.registry.collect() if family.name == name
               for sample in family.samples if sample.name == f"{name}_total")


def gated(gate: threading.Event, name: str) -> Callable[[Path, Settings], Engine]:
    """The service's engine factory, holding the load of bundle ``name`` until ``gate``."""
    def build(directory: Path, settings: Settings) -> Engine:
        if directory.name == name:
            assert gate.wait(60), "the test never opened the gate"
        return default_engine(directory, settings)

    return build


def test_a_budget_of_one_model_serves_alternating_pairs_and_pivots(models: Path) -> None:
    metrics = Metrics()
    settings = Settings(model_dir=models, model_memory_mb=model_mb(models) * 1.5, **ONE_THREAD)
    (s1, t1), (s2, t2) = PAIRS[:2]
    with Translator.load(settings, metrics=metrics) as translator:
        assert translator.engines == {}  # a budget and no PRELOAD: nothing loaded at start
        assert set(translator.pairs) == {("en", "de"), ("fr", "en")}
        assert translator.pivots == {("fr", "de"): "en"}
        unloaded: list[weakref.ref[Engine]] = []
        for pair in [("en", "de"), ("fr", "en"), ("en", "de"), ("fr", "en")]:
            assert [r.text for r in translator.translate_batch([s1, s2], pair)] == [t1, t2]
            assert list(translator.engines) == [pair]  # only the one used last is resident
            assert metrics.registry.get_sample_value("translate_models_resident") == 1
            # The engines unloaded before the last load are gone, sessions and all, not left
            # resident until Python's cyclic collector happens to run (the one just unloaded
            # may still be held by the worker thread that last ran it).
            assert [ref() for ref in unloaded[:-1]] == [None] * len(unloaded[:-1])
            unloaded.append(weakref.ref(translator.engines[pair]))
        assert total(metrics, "translate_model_loads") == 4
        assert total(metrics, "translate_model_unloads") == 3
        assert count(metrics, "translate_model_unloads_total", "en-de") == 2
        # X->en->Y across two legs that each load in turn, evicting the other.
        middle = translator.translate_batch([s1], ("fr", "en"))[0].text
        by_hand = translator.translate_batch([middle], ("en", "de"))[0].text
        assert translator.translate_batch([s1], ("fr", "de"))[0].text == by_hand
        assert list(translator.engines) == [("en", "de")]  # the second leg's
        assert total(metrics, "translate_model_loads") == 7  # en-de, then each leg
        # The one model counts as the resident memory its load added, never less than its
        # graphs (here its load added more than half the budget: no second model fits).
        resident = metrics.registry.get_sample_value("translate_models_resident_megabytes")
        assert model_mb(models) <= resident
        assert metrics.registry.get_sample_value("translate_model_loaded", {"model": "en-de"}) == 1
        assert metrics.registry.get_sample_value("translate_model_loaded", {"model": "fr-en"}) == 0


def test_concurrent_first_requests_load_the_model_once(models: Path) -> None:
    metrics = Metrics()
    # One sentence a request: the eight texts are eight requests at once, all finding the
    # model unloaded.
    settings = Settings(model_dir=models, model_memory_mb=1000, max_request_sentences=1,
                        **ONE_THREAD)
    texts = [source for source, _ in PAIRS[:8]]
    with Translator.load(settings, metrics=metrics) as translator:
        results = translator.translate_batch(texts, ("en", "de"))
        assert [r.text for r in results] == [target for _, target in PAIRS[:8]]
        assert count(metrics, "translate_model_loads_total", "en-de") == 1
        assert list(translator.engines) == [("en", "de")]


def test_a_pair_loading_does_not_hold_up_a_loaded_one(models: Path) -> None:
    gate = threading.Event()
    settings = Settings(model_dir=models, model_memory_mb=1000, preload=["en-de"], **ONE_THREAD)
    (source, target), = PAIRS[:1]
    with Translator.load(settings, gated(gate, "fr-en")) as translator:
        assert list(translator.engines) == [("en", "de")]

        async def main() -> None:
            loading = asyncio.create_task(
                translator.translate([source], ("fr", "en"), TranslateOptions()))
            await asyncio.sleep(0.1)  # the load has begun, and waits at the gate
            loaded = await asyncio.wait_for(
                translator.translate([source], ("en", "de"), TranslateOptions()), 30)
            assert loaded[0].text == target
            assert not loading.done()
            gate.set()
            assert (await loading)[0].text == target

        try:
            asyncio.run(main())
        finally:
            gate.set()


def test_preload_is_what_ready_waits_for_and_every_bundle_is_listed(models: Path) -> None:
    gate = threading.Event()
    settings = Settings(model_dir=models, model_memory_mb=1000, preload=["fr-en"], **ONE_THREAD)
    app = create_app(settings, engine_factory=gated(gate, "fr-en"))
    state = app.state.service
    (source, target), = PAIRS[:1]

    async def main() -> None:
        async with serving(app, wait=False) as client:
            await asyncio.sleep(0.2)
            response = await client.get("/ready")
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "not_ready"
            gate.set()
            for _ in range(600):
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert list(state.engines) == [("fr", "en")]  # PRELOAD's, not en-de
            languages = (await client.get("/languages")).json()["pairs"]
            assert [(p["source_lang"], p["target_lang"], p["model"]) for p in languages] == [
                ("en", "de", "en-de"), ("fr", "de", "fr-en+en-de"), ("fr", "en", "fr-en")]
            libre = (await client.get(f"{libretranslate.PREFIX}/languages")).json()
            assert {entry["code"]: entry["targets"] for entry in libre} == {
                "en": ["de"], "fr": ["de", "en"]}
            deepl_targets = (await client.get(f"{deepl.PREFIX}/languages?type=target")).json()
            assert {entry["language"] for entry in deepl_targets} == {"DE", "EN"}
            response = await client.post("/translate", json={
                "text": source, "source_lang": "en", "target_lang": "de"})
            assert response.status_code == 200, response.text
            assert response.json()["translations"] == [{"text": target}]
            assert set(state.engines) == {("en", "de"), ("fr", "en")}
            scraped = (await client.get("/metrics")).text
            assert 'translate_model_loads_total{model="en-de"} 1.0' in scraped
            assert "translate_models_resident 2.0" in scraped

    try:
        asyncio.run(main())
    finally:
        gate.set()


def test_the_scheduler_takes_pairs_in_and_out_only_when_empty() -> None:
    en_de = FakeEngine()
    fr_en = FakeEngine(source_lang="fr", target_lang="en", step_s=0.01)
    scheduler = Scheduler({"en-de": en_de}, metrics=Metrics())
    scheduler.start()
    scheduler.add_pairs({"fr-en": fr_en})

    async def main() -> None:
        running = asyncio.create_task(scheduler.translate(
            "fr-en", [fr_en.tokenize("a b c d e f g h")], DecodeOptions()))
        await asyncio.sleep(0.02)
        assert not scheduler.remove_pairs(["fr-en"])  # a sentence runs
        assert (await running)[0].text == "A B C D E F G H"
        assert scheduler.remove_pairs(["fr-en"])
        assert [t.text for t in await scheduler.translate(
            "en-de", [en_de.tokenize("x y")], DecodeOptions())] == ["X Y"]

    asyncio.run(main())
    scheduler.stop()


def test_a_bundle_that_fails_to_load_answers_503_in_each_api_and_spares_the_others(
        models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A corrupt bundle (a graph's byte flipped: its checksum fails when it loads) beside
    two sound ones: its requests get 503 naming the pair and the cause, with Retry-After, in
    each API's error shape, without a load per request; the other pairs translate, before and
    after; once repaired, it loads on the next request after the wait."""
    from service import residency

    root = tmp_path / "models"
    shutil.copytree(models, root)
    shutil.copytree(models / "en-de", root / "es-en")
    manifest = json.loads((root / "es-en" / "manifest.json").read_text())
    manifest.update(source_lang="es", target_lang="en")
    (root / "es-en" / "manifest.json").write_text(json.dumps(manifest))
    graph = load_bundle(root / "es-en").graph_paths(None)[0]
    sound = graph.read_bytes()
    graph.write_bytes(sound[:100] + bytes([sound[100] ^ 0xFF]) + sound[101:])
    app = create_app(Settings(model_dir=root, model_memory_mb=1000, **ONE_THREAD))
    metrics: Metrics = app.state.service.metrics
    (source, target), = PAIRS[:1]

    async def main() -> None:
        async with serving(app) as client:
            response = await client.post("/translate", json={
                "text": source, "source_lang": "es", "target_lang": "en"})
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "model_unavailable"
            assert "es-en" in error["message"] and "corrupted" in error["message"]
            assert str(root) not in error["message"]
            assert 1 <= int(response.headers["Retry-After"]) <= residency.LOAD_RETRY_S
            # The other pairs were not held up and load and translate as before.
            response = await client.post("/translate", json={
                "text": source, "source_lang": "en", "target_lang": "de"})
            assert response.status_code == 200, response.text
            assert response.json()["translations"] == [{"text": target}]
            libre = await client.post(f"{libretranslate.PREFIX}/translate", json={
                "q": source, "source": "es", "target": "en"})
            assert libre.status_code == 503 and "Retry-After" in libre.headers
            assert set(libre.json()) == {"error"} and "es-en" in libre.json()["error"]
            deepl_answer = await client.post(f"{deepl.PREFIX}/translate", json={
                "text": [source], "source_lang": "ES", "target_lang": "EN"})
            assert deepl_answer.status_code == 503 and "Retry-After" in deepl_answer.headers
            assert "es-en" in deepl_answer.json()["message"]
            # One load tried, its answer repeated until the wait is over.
            assert count(metrics, "translate_model_load_failures_total", "es-en") == 1
            response = await client.post("/translate", json={
                "text": source, "source_lang": "fr", "target_lang": "en"})
            assert response.status_code == 200, response.text

            graph.write_bytes(sound)  # repaired (reinstalled), and the wait over
            monkeypatch.setattr(residency, "LOAD_RETRY_S", 0.0)
            response = await client.post("/translate", json={
                "text": source, "source_lang": "es", "target_lang": "en"})
            assert response.status_code == 200, response.text
            assert response.json()["translations"] == [{"text": target}]
            assert count(metrics, "translate_model_load_failures_total", "es-en") == 1

    asyncio.run(main())
