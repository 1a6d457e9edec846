"""The HTTP API: round trips, limits and errors, auth, readiness, metrics, shutdown.

Contract tests (errors, limits, auth, readiness) run against ``FakeEngine`` bundles so they are
fast and deterministic; translations and concurrency run against the real tiny bundle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from service.main import Server, create_app, logging_config
from service.scheduler import QueueFull
from service.settings import Settings
from tests.faults import Faults, FaultyEngine
from tests.test_scheduler import FakeEngine

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"


# -- helpers ------------------------------------------------------------------------------------


def fake_models(root: Path, *pairs: str) -> Path:
    for pair in pairs:
        (root / pair).mkdir(parents=True)
        (root / pair / "manifest.json").write_text("{}")
    return root


def fake_factory(**engine_kwargs: Any) -> Callable[[Path, Settings], FakeEngine]:
    def build(directory: Path, settings: Settings) -> FakeEngine:
        source, target = directory.name.split("-")
        return FakeEngine(directory, source_lang=source, target_lang=target, **engine_kwargs)

    return build


@asynccontextmanager
async def serving(app: FastAPI, wait: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, and a client talking to it in-process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            if wait:
                await wait_ready(client)
            yield client


def check_app(bundle: Path, check: Callable[[httpx.AsyncClient], Awaitable[None]],
              **settings: Any) -> None:
    """Serve ``bundle`` in-process (one worker, one thread) and run ``check`` against it."""
    app = create_app(Settings(model_dir=bundle, workers=1, threads=1, **settings))

    async def main() -> None:
        async with serving(app) as client:
            await check(client)

    asyncio.run(main())


async def wait_ready(client: httpx.AsyncClient, timeout: float = 60) -> None:
    stop = time.monotonic() + timeout
    while (response := await client.get("/ready")).status_code != 200:
        assert response.json()["error"]["code"] in ("not_ready",), response.text
        assert time.monotonic() < stop, "service never became ready"
        await asyncio.sleep(0.01)


def fake_app(tmp_path: Path, *pairs: str, engine_kwargs: dict | None = None, **settings) -> FastAPI:
    models = fake_models(tmp_path / "models", *(pairs or ("en-de",)))
    return create_app(
        Settings(model_dir=models, **settings), engine_factory=fake_factory(**(engine_kwargs or {}))
    )


def faulty_app(tmp_path: Path, faults: Faults, step_s: float, **settings: Any) -> FastAPI:
    """An app over an en-de ``FakeEngine`` whose batches fail as ``faults`` says."""

    def factory(directory: Path, _: Settings) -> FaultyEngine:
        return FaultyEngine(FakeEngine(directory, step_s=step_s), faults)

    models = fake_models(tmp_path / "models", "en-de")
    return create_app(Settings(model_dir=models, **settings), engine_factory=factory)


def engine_of(app: FastAPI, pair: tuple[str, str] = ("en", "de")) -> FakeEngine:
    return app.state.service.engines[pair]


def assert_error(response: httpx.Response, status: int, code: str, field: str | None = None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"].get("field") == field, body


def run(coroutine) -> Any:
    return asyncio.run(coroutine)


# -- contract, with fake engines ----------------------------------------------------------------


def test_round_trip_keeps_layout_and_order(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            response = await client.post("/translate", json={"text": "hello world"})
            assert response.status_code == 200
            assert response.json() == {
                "translations": [{"text": "HELLO WORLD"}],
                "source_lang": "en",
                "target_lang": "de",
            }
            text = "  First one. Second one!\n\nThird para.\n"
            response = await client.post("/translate", json={"text": [text, "x", ""]})
            results = [r["text"] for r in response.json()["translations"]]
            assert results == ["  FIRST ONE. SECOND ONE!\n\nTHIRD PARA.\n", "X", ""]

    run(main())


def test_empty_texts_come_back_without_touching_the_model(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            steps = engine_of(app).steps
            response = await client.post(
                "/translate", json={"text": ["", "   ", "\n\n\t"], "return_scores": True}
            )
            assert response.status_code == 200
            assert response.json()["translations"] == [
                {"text": ""},
                {"text": "   "},
                {"text": "\n\n\t"},
            ]
            assert engine_of(app).steps == steps
            response = await client.post("/translate", json={"text": []})
            assert response.json()["translations"] == []

    run(main())


def test_scores_and_alternatives(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            response = await client.post(
                "/translate",
                json={"text": "Ab cd. Ef", "num_alternatives": 2, "return_scores": True},
            )
            (result,) = response.json()["translations"]
            assert result["text"] == "AB CD. EF"
            assert result["score"] == pytest.approx(-0.1)
            assert [a["text"] for a in result["alternatives"]] == ["AB CD.! EF!", "AB CD.!! EF!!"]
            assert [a["score"] for a in result["alternatives"]] == pytest.approx([-0.2, -0.3])
            response = await client.post("/translate", json={"text": "a", "beam_size": 2})
            assert "alternatives" not in response.json()["translations"][0]

    run(main())


def test_sentences_come_with_their_sources_and_their_own_alternatives(tmp_path: Path) -> None:
    app = fake_app(tmp_path, "de-en", "en-fr")

    async def main() -> None:
        async with serving(app) as client:
            text = "  Ab cd.\n\nEf gh? "
            response = await client.post("/translate", json={
                "text": [text, "Ij"], "source_lang": "de", "target_lang": "en",
                "return_sentences": True, "num_alternatives": 1, "return_scores": True})
            first, second = response.json()["translations"]
            assert [s["source"] for s in first["sentences"]] == ["Ab cd.", "Ef gh?"]
            assert [s["text"] for s in first["sentences"]] == ["AB CD.", "EF GH?"]
            assert first["separators"] == ["  ", "\n\n", " "]
            pieces = [first["separators"][0]]
            for sentence, separator in zip(first["sentences"], first["separators"][1:],
                                           strict=True):
                pieces += [sentence["text"], separator]
            assert "".join(pieces) == first["text"]
            assert [a["text"] for s in first["sentences"] for a in s["alternatives"]] == [
                "AB CD.!", "EF GH?!"]
            assert first["sentences"][0]["score"] == pytest.approx(-0.1)
            assert second["sentences"] == [
                {"source": "Ij", "text": "IJ", "score": pytest.approx(-0.1),
                 "alternatives": [{"text": "IJ!", "score": pytest.approx(-0.2)}]}]
            # Through a pivot, a sentence's source is what the second leg read.
            response = await client.post("/translate", json={
                "text": "Ab cd.", "source_lang": "de", "target_lang": "fr",
                "return_sentences": True})
            (result,) = response.json()["translations"]
            assert response.json()["pivot_lang"] == "en"
            assert result["sentences"] == [{"source": "AB CD.", "text": "AB CD."}]
            plain = await client.post("/translate", json={"text": "Ab", "source_lang": "de"})
            assert "sentences" not in plain.json()["translations"][0]
            refused = await client.post("/translate", json={
                "text": "<p>Ab</p>", "format": "html", "source_lang": "de",
                "return_sentences": True})
            assert_error(refused, 422, "invalid_field", "return_sentences")

    run(main())


def test_sentences_longer_than_the_model_are_split_not_cut(tmp_path: Path) -> None:
    app = fake_app(tmp_path, engine_kwargs={"max_source_tokens": 6})

    async def main() -> None:
        async with serving(app) as client:
            text = " ".join(f"w{i}" for i in range(23)) + "."
            response = await client.post("/translate", json={"text": text})
            assert response.status_code == 200
            assert response.json()["translations"][0]["text"] == text.upper()

    run(main())


def test_repeated_sentences_are_decoded_once(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            before = app.state.service.metrics.registry.get_sample_value(
                "translate_sentences_total", {"pair": "en-de", "outcome": "done"}
            )
            response = await client.post("/translate", json={"text": ["Same.", "Same. Same."]})
            assert [t["text"] for t in response.json()["translations"]] == ["SAME.", "SAME. SAME."]
            after = app.state.service.metrics.registry.get_sample_value(
                "translate_sentences_total", {"pair": "en-de", "outcome": "done"}
            )
            assert after - before == 1

    run(main())


NO_REPEAT = "no_repeat_ngram_size"


@pytest.mark.parametrize(
    ("content", "status", "code", "field"),
    [
        (b'{"text": "a"', 400, "invalid_json", None),
        (b"", 400, "invalid_json", None),
        (b'{"text": "caf\xe9"}', 400, "invalid_encoding", None),
        (b'{"text": "a\\ud800"}', 400, "invalid_json", None),
        (b'["a"]', 422, "invalid_body", None),
        (b"null", 422, "invalid_body", None),
        (b"{}", 422, "missing_field", "text"),
        (b'{"text": "a", "beamsize": 2}', 422, "unknown_field", "beamsize"),
        (b'{"text": 5}', 422, "invalid_field", "text"),
        (b'{"text": null}', 422, "invalid_field", "text"),
        (b'{"text": ["a", 3]}', 422, "invalid_field", "text[1]"),
        (b'{"text": "a", "beam_size": "4"}', 422, "invalid_field", "beam_size"),
        (b'{"text": "a", "beam_size": 2.5}', 422, "invalid_field", "beam_size"),
        (b'{"text": "a", "beam_size": 0}', 422, "invalid_field", "beam_size"),
        (b'{"text": "a", "beam_size": 9}', 422, "invalid_field", "beam_size"),
        (b'{"text": "a", "max_length": 0}', 422, "invalid_field", "max_length"),
        (b'{"text": "a", "max_length": 257}', 422, "invalid_field", "max_length"),
        (b'{"text": "a", "length_penalty": -0.5}', 422, "invalid_field", "length_penalty"),
        (b'{"text": "a", "length_penalty": 5}', 422, "invalid_field", "length_penalty"),
        (b'{"text": "a", "length_penalty": "1"}', 422, "invalid_field", "length_penalty"),
        (b'{"text": "a", "max_length_ratio": 0}', 422, "invalid_field", "max_length_ratio"),
        (b'{"text": "a", "max_length_ratio": 17}', 422, "invalid_field", "max_length_ratio"),
        (b'{"text": "a", "num_alternatives": -1}', 422, "invalid_field", "num_alternatives"),
        (b'{"text": "<p>a</p>", "format": "html", "beam_size": 4, "num_alternatives": 1}', 422,
         "invalid_field", "num_alternatives"),
        (b'{"text": "<p>a</p>", "format": "html", "return_scores": true}', 422,
         "invalid_field", "return_scores"),
        (b'{"text": "a", "no_repeat_ngram_size": -1}', 422, "invalid_field", NO_REPEAT),
        (b'{"text": "a", "no_repeat_ngram_size": 65}', 422, "invalid_field", NO_REPEAT),
        (b'{"text": "a", "no_repeat_ngram_size": "3"}', 422, "invalid_field", NO_REPEAT),
        (
            b'{"text": "a", "beam_size": 2, "num_alternatives": 2}',
            422,
            "invalid_field",
            "num_alternatives",
        ),
        (b'{"text": "a", "num_alternatives": 8}', 422, "invalid_field", "num_alternatives"),
        (b'{"text": "a", "return_scores": "yes"}', 422, "invalid_field", "return_scores"),
        (b'{"text": "a", "source_lang": 5}', 422, "invalid_field", "source_lang"),
        (b'{"text": "a", "target_lang": "fr"}', 422, "unsupported_language_pair", "target_lang"),
        (b'{"text": "a", "source_lang": "xx"}', 422, "unsupported_language_pair", "source_lang"),
        (b'{"text": "a", "source_lang": ""}', 422, "invalid_field", "source_lang"),
        (b'{"text": ["a", "b", "c", "d", "e"]}', 413, "too_many_texts", "text"),
        (b'{"text": ["a", "' + b"x" * 101 + b'"]}', 413, "text_too_long", "text[1]"),
        (b'{"text": "' + b"x" * 101 + b'"}', 413, "text_too_long", "text"),
    ],
)
def test_bad_requests_get_their_documented_error(
    tmp_path: Path, content: bytes, status: int, code: str, field: str | None
) -> None:
    app = fake_app(tmp_path, max_texts=4, max_chars=100)

    async def main() -> None:
        async with serving(app) as client:
            response = await client.post(
                "/translate", content=content, headers={"content-type": "application/json"}
            )
            assert_error(response, status, code, field)

    run(main())


def test_limits_other_routes_and_content_types(tmp_path: Path) -> None:
    app = fake_app(tmp_path, max_texts=4, max_chars=100)

    async def main() -> None:
        async with serving(app) as client:
            huge = json.dumps({"text": ["x"] * 200_000}).encode()
            assert_error(await client.post("/translate", content=huge), 413, "body_too_large")
            many = json.dumps({"text": [""] * 1000}).encode()
            response = await client.post("/translate", content=many)
            assert_error(response, 413, "too_many_texts", "text")
            assert_error(await client.get("/nowhere"), 404, "not_found")
            response = await client.get("/translate")
            assert_error(response, 405, "method_not_allowed")
            assert "POST" in response.headers["allow"]
            # curl -d sends a form content type; the JSON body is still read.
            response = await client.post(
                "/translate",
                content=b'{"text": "a"}',
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert response.status_code == 200

    run(main())


def test_a_byte_order_mark_is_tolerated(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            response = await client.post("/translate", content=b'\xef\xbb\xbf{"text": "bom"}')
            assert response.json()["translations"] == [{"text": "BOM"}]

    run(main())


def test_api_keys(tmp_path: Path) -> None:
    app = fake_app(tmp_path, api_keys="k1,k2")

    async def main() -> None:
        async with serving(app) as client:
            for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "k1"}):
                response = await client.post("/translate", json={"text": "a"}, headers=headers)
                assert_error(response, 401, "unauthorized")
                assert response.headers["www-authenticate"] == "Bearer"
            assert_error(await client.get("/languages"), 401, "unauthorized")
            ok = await client.post(
                "/translate", json={"text": "a"}, headers={"authorization": "Bearer k2"}
            )
            assert ok.status_code == 200
            for path in ("/health", "/ready"):  # probes need no key
                assert (await client.get(path)).status_code == 200
            # What describes the service is locked too (OPEN_DOCS opens it).
            for path in ("/metrics", "/docs", "/redoc", "/openapi.json"):
                assert_error(await client.get(path), 401, "unauthorized")
                keyed = await client.get(path, headers={"authorization": "Bearer k1"})
                assert keyed.status_code == 200, (path, keyed.text)
            assert (await client.get("/metrics?api_key=k2")).status_code == 200
            spec = await client.get("/libretranslate/spec")
            assert spec.status_code == 401 and set(spec.json()) == {"error"}

    run(main())


def test_open_docs_opens_metrics_and_docs(tmp_path: Path) -> None:
    app = fake_app(tmp_path, api_keys="k1", open_docs=True)

    async def main() -> None:
        async with serving(app) as client:
            for path in ("/metrics", "/docs", "/openapi.json", "/libretranslate/spec"):
                assert (await client.get(path)).status_code == 200, path
            assert_error(await client.get("/languages"), 401, "unauthorized")

    run(main())


def test_ready_is_503_until_loaded_and_warmed_up(tmp_path: Path) -> None:
    release = threading.Event()

    def slow_factory(directory: Path, settings: Settings) -> FakeEngine:
        release.wait(10)
        return FakeEngine(directory)

    models = fake_models(tmp_path / "models", "en-de")
    app = create_app(Settings(model_dir=models), engine_factory=slow_factory)

    async def main() -> None:
        async with serving(app, wait=False) as client:
            assert (await client.get("/health")).status_code == 200
            assert_error(await client.get("/ready"), 503, "not_ready")
            response = await client.post("/translate", json={"text": "a"})
            assert_error(response, 503, "not_ready")
            assert response.headers["retry-after"]
            assert (await client.get("/languages")).json() == {"pairs": []}
            release.set()
            await wait_ready(client)
            assert (await client.post("/translate", json={"text": "a"})).status_code == 200

    run(main())


def test_a_failed_load_fails_health(tmp_path: Path) -> None:
    app = create_app(Settings(model_dir=tmp_path / "empty"))

    async def main() -> None:
        async with serving(app, wait=False) as client:
            for _ in range(200):
                if app.state.service.phase == "failed":
                    break
                await asyncio.sleep(0.01)
            assert_error(await client.get("/health"), 503, "load_failed")
            assert_error(await client.get("/ready"), 503, "load_failed")

    run(main())


def test_models_setting_picks_the_bundles_that_load(tmp_path: Path) -> None:
    app = fake_app(tmp_path, "en-de", "de-en", "en-fr", models="en-fr, de-en")

    async def main() -> None:
        async with serving(app) as client:
            pairs = (await client.get("/languages")).json()["pairs"]
            loaded = [p["model"] for p in pairs if "pivot_lang" not in p]
            assert loaded == ["de-en", "en-fr"]

    run(main())
    typo = fake_app(tmp_path / "typo", "en-de", models="en-fr")

    async def failed() -> None:
        async with serving(typo, wait=False) as client:
            while typo.state.service.phase == "loading":
                await asyncio.sleep(0.01)
            response = await client.get("/health")
            assert_error(response, 503, "load_failed")
            assert "MODELS names en-fr" in response.json()["error"]["message"]

    run(failed())


def test_a_repeated_sentence_is_served_from_the_sentence_cache(tiny_bundle: Path) -> None:
    source, target = FIXTURE.read_text(encoding="utf-8").splitlines()[6].split("\t")

    async def check(client: httpx.AsyncClient) -> None:
        def counter(body: str, name: str) -> float:  # summed over its labels
            return sum(float(x.split()[-1]) for x in body.splitlines()
                       if x.startswith((name + " ", name + "{")))

        first = await client.post("/translate", json={"text": source})
        before = (await client.get("/metrics")).text
        second = await client.post("/translate", json={"text": source})
        after = (await client.get("/metrics")).text
        assert first.json() == second.json()
        assert first.json()["translations"][0]["text"] == target
        hits = "translate_sentence_cache_hits_total"
        assert counter(after, hits) == counter(before, hits) + 1
        steps = "translate_decode_steps_total"
        assert counter(after, steps) == counter(before, steps)  # nothing decoded again

    check_app(tiny_bundle, check)


def test_html_keeps_its_markup_and_malformed_html_is_no_500(tiny_bundle: Path) -> None:
    pairs = [line.split("\t") for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    (first, first_de), (second, second_de) = pairs[0], pairs[2]
    html = (f"<div>\n  <p>{first}</p>\n  <!-- kept -->\n  <p>{second}</p>\n"
            "  <pre>x &lt; y</pre><p translate=\"no\">Keep this.</p>\n</div>")

    async def check(client: httpx.AsyncClient) -> None:
        response = await client.post("/translate", json={"text": html, "format": "html"})
        assert response.status_code == 200, response.text
        assert response.json()["translations"][0]["text"] == (
            f"<div>\n  <p>{first_de}</p>\n  <!-- kept -->\n  <p>{second_de}</p>\n"
            "  <pre>x &lt; y</pre><p translate=\"no\">Keep this.</p>\n</div>")
        for broken in ("<p>Unclosed <b>tag", "a < b & c", "<![CDATA[x", "</p></div>"):
            response = await client.post("/translate", json={"text": broken, "format": "html"})
            assert response.status_code == 200, (broken, response.text)

    check_app(tiny_bundle, check)


def test_untranslatables_come_back_verbatim_as_often_as_they_went_in(tiny_bundle: Path) -> None:
    items = ["%s", "{count}", "%1$d", "https://example.org/a?b=1", "info@example.org", "20",
             "🍕"]
    text = ("Open %s and {count} files (%1$d new) at https://example.org/a?b=1 or write to "
            "info@example.org within 20 minutes 🍕")

    async def check(client: httpx.AsyncClient) -> None:
        response = await client.post("/translate", json={"text": [text, text + " %s"]})
        first, second = (t["text"] for t in response.json()["translations"])
        for item in items:
            assert first.count(item) == 1, (item, first)
        assert second.count("%s") == 2, second

    check_app(tiny_bundle, check)


def test_languages_and_pair_choice(tmp_path: Path) -> None:
    app = fake_app(tmp_path, "en-de", "de-en", "en-fr")

    async def main() -> None:
        async with serving(app) as client:
            pairs = (await client.get("/languages")).json()["pairs"]
            assert [(p["source_lang"], p["target_lang"], p["model"]) for p in pairs] == [
                ("de", "en", "de-en"),
                ("de", "fr", "de-en+en-fr"),  # through English
                ("en", "de", "en-de"),
                ("en", "fr", "en-fr"),
            ]
            assert [p.get("pivot_lang") for p in pairs] == [None, "en", None, None]

            async def pair_for(**langs: str) -> tuple[str, str]:
                body = (await client.post("/translate", json={"text": "a", **langs})).json()
                return body["source_lang"], body["target_lang"]

            assert await pair_for() == ("en", "de")  # the default pair
            assert await pair_for(target_lang="FR") == ("en", "fr")
            assert await pair_for(source_lang="de") == ("de", "en")
            assert await pair_for(target_lang="en") == ("de", "en")
            response = await client.post("/translate", json={"text": "a", "target_lang": "xx"})
            assert_error(response, 422, "unsupported_language_pair", "target_lang")

    run(main())


def test_ambiguous_pair(tmp_path: Path) -> None:
    app = fake_app(tmp_path, "fr-es", "fr-it")

    async def main() -> None:
        async with serving(app) as client:
            response = await client.post("/translate", json={"text": "a"})
            assert_error(response, 422, "ambiguous_language_pair", "target_lang")
            response = await client.post("/translate", json={"text": "a", "target_lang": "it"})
            assert response.json()["source_lang"] == "fr"

    run(main())


def test_a_full_queue_refuses_before_reading_the_body(tmp_path: Path) -> None:
    """Past capacity the refusal is the cheapest one: a 429 before the body is read (here a
    body that is not even JSON, which would otherwise be a 422)."""
    # The loop-lag shedding kept out of the way: on a busy machine it may answer 503 first.
    app = fake_app(tmp_path, engine_kwargs={"step_s": 0.05}, max_queue=3, max_batch_rows=1,
                   max_loop_lag_s=60)

    async def main() -> None:
        async with serving(app) as client:
            # Requests sent one by one, each a moment after the last (so that the workers
            # take theirs), until the queue has no room for one more sentence.
            scheduler = app.state.service.scheduler
            running: list[asyncio.Future] = []
            full = False
            for i in range(40):
                try:
                    scheduler.check_room()
                except QueueFull:
                    full = True
                    break
                running.append(asyncio.ensure_future(
                    client.post("/translate", json={"text": f"t{i} u{i} v{i}"})))
                await asyncio.sleep(0.02)
            done = [task.result().status_code for task in running if task.done()]
            assert full, f"the queue never filled; answered meanwhile: {done}"
            response = await client.post("/translate", content=b"{not json",
                                         headers={"content-type": "application/json"})
            assert_error(response, 429, "queue_full")
            assert int(response.headers["retry-after"]) >= 1
            statuses = [r.status_code for r in await asyncio.gather(*running)]
            assert set(statuses) <= {200, 429} and statuses.count(200) >= 3

    run(main())


def test_queue_full_is_429_and_accepted_requests_are_answered(tmp_path: Path) -> None:
    app = fake_app(tmp_path, engine_kwargs={"step_s": 0.005}, max_queue=3, max_batch_rows=1)

    async def main() -> None:
        async with serving(app) as client:
            texts = [f"t{i} u{i} v{i}" for i in range(30)]
            responses = await asyncio.gather(
                *(client.post("/translate", json={"text": text}) for text in texts)
            )
            statuses = [r.status_code for r in responses]
            assert set(statuses) == {200, 429}, statuses
            for text, response in zip(texts, responses, strict=True):
                if response.status_code == 200:
                    assert response.json()["translations"][0]["text"] == text.upper()
                else:
                    assert_error(response, 429, "queue_full")
                    assert int(response.headers["retry-after"]) >= 1
            assert app.state.service.scheduler.queue_depth == 0

    run(main())


def test_a_request_over_the_sentence_limit_is_413_before_any_work(tmp_path: Path) -> None:
    app = fake_app(tmp_path, max_request_sentences=4, max_queue=100, max_request_chars=59)

    async def main() -> None:
        async with serving(app) as client:
            tokenised = set(engine_of(app).vocab)
            five = "One. Two. Three. Four. Five."
            response = await client.post("/translate", json={"text": ["Ok.", five]})
            assert_error(response, 413, "too_many_sentences", "text")
            assert "MAX_REQUEST_SENTENCES" in response.json()["error"]["message"]
            assert set(engine_of(app).vocab) == tokenised  # refused before tokenising
            response = await client.post("/translate", json={"text": ["a" * 30] * 2})
            assert_error(response, 413, "too_many_characters", "text")
            assert "MAX_REQUEST_CHARS" in response.json()["error"]["message"]
            # The estimate errs high ("Mr. and Mrs." may end sentences); over the limit, the
            # request is counted exactly before it is refused: these are 4 sentences, not 6.
            titles = "Mr. and Mrs. Smith. Bye. One. Two."
            response = await client.post("/translate", json={"text": titles})
            assert response.status_code == 200, response.text
            # The same text twice counts once, as it is translated once.
            four = "One. Two. Three. Four."
            response = await client.post("/translate", json={"text": [four, four]})
            assert response.status_code == 200, response.text
            assert app.state.service.scheduler.queue_depth == 0

    run(main())


def test_rate_limits_per_api_key(tmp_path: Path) -> None:
    app = fake_app(tmp_path, api_keys="k1,k2", requests_per_minute=2, chars_per_minute=30)

    async def main() -> None:
        async with serving(app) as client:

            def post(key: str, text: str):
                headers = {"authorization": f"Bearer {key}"}
                return client.post("/translate", json={"text": text}, headers=headers)

            assert (await post("k1", "a b c")).status_code == 200
            assert (await post("k1", "d e f")).status_code == 200
            refused = await post("k1", "g h")
            assert_error(refused, 429, "rate_limited")
            assert "REQUESTS_PER_MINUTE" in refused.json()["error"]["message"]
            assert 1 <= int(refused.headers["retry-after"]) <= 30  # one request refills in 30 s
            # Another key has its own allowance, of characters too.
            assert (await post("k2", "x" * 25)).status_code == 200
            refused = await post("k2", "y" * 10)
            assert_error(refused, 429, "rate_limited")
            assert "CHARS_PER_MINUTE" in refused.json()["error"]["message"]
            assert_error(await post("k2", "z" * 31), 413, "over_rate_limit", "text")

    run(main())


def test_a_poison_sentence_fails_only_its_request(tmp_path: Path) -> None:
    faults = Faults()

    def factory(directory: Path, settings: Settings) -> FaultyEngine:
        engine = FakeEngine(directory, step_s=0.003)
        faults.poison = tuple(engine.tokenize("poison pill"))
        return FaultyEngine(engine, faults)

    models = fake_models(tmp_path / "models", "en-de")
    app = create_app(Settings(model_dir=models), engine_factory=factory)

    async def main() -> None:
        async with serving(app) as client:
            texts = [f"t{i} u{i} v{i}." for i in range(20)]
            texts[7] = "Innocent one.\npoison pill"
            headers = {"x-request-id": "bad-apple"}
            responses = await asyncio.gather(*(
                client.post("/translate", json={"text": t}, headers=headers if i == 7 else {})
                for i, t in enumerate(texts)
            ))
            failed = responses[7]
            assert_error(failed, 500, "translation_failed")
            assert failed.headers["x-request-id"] == "bad-apple"
            assert "bad-apple" in failed.json()["error"]["message"]
            for i, response in enumerate(responses):
                if i != 7:
                    assert response.json()["translations"][0]["text"] == texts[i].upper()
            metrics = (await client.get("/metrics")).text
            assert 'translate_sentences_total{outcome="failed",pair="en-de"} 1.0' in metrics
            assert (await client.get("/ready")).status_code == 200
            assert (await client.get("/health")).status_code == 200

    run(main())


POISONS = ("alpha", "beta", "gamma", "delta")


def test_several_poison_sentences_at_once_never_stop_translation(tmp_path: Path) -> None:
    """Four different poison sentences, four at a time and again and again: each fails only
    its own request (its copies refused unrun, from quarantine), innocent requests keep their
    200s, the workers are not taken for broken (the canary still translates), and the
    service stays healthy."""
    faults = Faults()

    def factory(directory: Path, settings: Settings) -> FaultyEngine:
        engine = FakeEngine(directory, step_s=0.002)
        faults.poisons = {tuple(engine.tokenize(f"poison {name}")) for name in POISONS}
        return FaultyEngine(engine, faults)

    models = fake_models(tmp_path / "models", "en-de")
    app = create_app(Settings(model_dir=models, cache_mb=0), engine_factory=factory)

    async def main() -> None:
        async with serving(app) as client:
            for round_ in range(8):
                texts = [f"poison {name}" for name in POISONS]
                texts += [f"innocent {name} {round_}" for name in "abcdefgh"]
                responses = await asyncio.gather(
                    *(client.post("/translate", json={"text": t}) for t in texts))
                for text, response in zip(texts, responses, strict=True):
                    if text.startswith("poison"):
                        assert_error(response, 500, "translation_failed")
                    else:
                        assert response.status_code == 200, response.text
                        assert response.json()["translations"][0]["text"] == text.upper()
            assert (await client.get("/health")).status_code == 200
            assert (await client.get("/ready")).status_code == 200
            # Each poison failed a step once or a few times while first met, never again.
            assert faults.steps_failed <= 4 * 4

    run(main())


def test_every_step_failing_for_a_while_loses_no_request(tmp_path: Path) -> None:
    """The engine fails every step for 0.25 s under load: every request still gets 200 with
    its translation, and the service stays healthy and ready, quarantining nothing."""
    faults = Faults()
    app = faulty_app(tmp_path, faults, step_s=0.002, cache_mb=0)

    async def main() -> None:
        async with serving(app) as client:
            async def one(i: int) -> None:
                await asyncio.sleep(0.01 * i)
                text = f"k{i} l{i}. m{i} n{i}."
                response = await client.post("/translate", json={"text": text})
                assert response.status_code == 200, response.text
                assert response.json()["translations"][0]["text"] == text.upper()

            requests = asyncio.gather(*(one(i) for i in range(30)))
            await asyncio.sleep(0.03)
            faults.break_for(0.25)
            await requests
            assert faults.steps_failed > 0
            metrics = (await client.get("/metrics")).text
            assert 'translate_sentences_total{outcome="failed",pair="en-de"} 0.0' in metrics
            assert (await client.get("/health")).status_code == 200
            assert (await client.get("/ready")).status_code == 200

    run(main())


def test_health_fails_when_the_workers_cannot_translate(tmp_path: Path) -> None:
    faults = Faults()
    app = faulty_app(tmp_path, faults, step_s=0.001, engine_failure_s=0.5)

    async def main() -> None:
        async with serving(app) as client:
            faults.fail_steps = 10**6  # the replica breaks for good after warming up
            statuses = set()
            for i in range(30):
                response = await client.post("/translate", json={"text": f"q{i}"})
                statuses.add(response.status_code)
                if (await client.get("/health")).status_code == 503:
                    break
            assert statuses <= {500, 503}, statuses  # answered, never hanging
            assert_error(await client.get("/health"), 503, "unavailable")
            assert (await client.get("/ready")).status_code == 503
            response = await client.post("/translate", json={"text": "later"})
            assert response.status_code == 503

    run(main())


def test_ready_fails_while_the_only_worker_is_being_restarted(tmp_path: Path) -> None:
    faults = Faults()
    app = faulty_app(tmp_path, faults, step_s=0.02, request_timeout_s=1.0)

    async def main() -> None:
        async with serving(app) as client:
            # A restarted worker waits 0.1 s, then proves itself on the shortest sentence
            # translated (the warm-up's, 3 steps of 20 ms) before it takes work.
            served = " ".join(f"c{i}" for i in range(30))
            assert (await client.post("/translate", json={"text": served})).status_code == 200
            faults.fail_removes = 1  # dropping the next expired request kills the worker
            killer = " ".join(f"k{i}" for i in range(80))
            assert_error(await client.post("/translate", json={"text": killer}), 504, "timeout")
            statuses = []  # from the death (the next step, ~20 ms on) until proven again
            waiting = None
            for _ in range(300):
                response = await client.get("/ready")
                statuses.append(response.status_code)
                if response.status_code == 200 and 503 in statuses:
                    break
                if response.status_code == 503:
                    assert_error(response, 503, "no_healthy_worker")
                    if waiting is None:  # queued meanwhile, served once the worker is back
                        text = {"text": "later"}
                        waiting = asyncio.ensure_future(client.post("/translate", json=text))
                await asyncio.sleep(0.01)
            assert waiting is not None
            assert statuses[-1] == 200 and statuses.count(503) >= 10, statuses  # ~0.16 s
            assert (await client.get("/ready")).status_code == 200
            assert (await client.get("/health")).status_code == 200  # restarting, not failed
            assert (await waiting).json()["translations"][0]["text"] == "LATER"

    run(main())


def test_deadline_gives_504_and_drops_the_sentences(tmp_path: Path) -> None:
    app = fake_app(tmp_path, engine_kwargs={"step_s": 0.005}, request_timeout_s=0.1)

    async def main() -> None:
        async with serving(app) as client:
            long_text = " ".join(f"w{i}" for i in range(60))
            slow, quick = await asyncio.gather(
                client.post("/translate", json={"text": long_text}),
                client.post("/translate", json={"text": "fast"}),
            )
            assert_error(slow, 504, "timeout")
            assert quick.json()["translations"][0]["text"] == "FAST"
            scheduler = app.state.service.scheduler
            await asyncio.to_thread(scheduler.wait_idle, 5)
            assert len(engine_of(app).removed) == 1

    run(main())


def test_metrics_endpoint(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            await client.post("/translate", json={"text": "a b"})
            await client.post("/translate", json={"text": 1})
            await client.get("/nowhere/at/all")
            text = (await client.get("/metrics")).text
            for line in (
                'translate_http_requests_total{method="POST",route="/translate",status="200"} 1.0',
                'translate_http_requests_total{method="POST",route="/translate",status="422"} 1.0',
                'translate_http_requests_total{method="GET",route="unmatched",status="404"} 1.0',
                "translate_queue_depth 0.0",
            ):
                assert line in text, line
            for name in (
                "translate_http_request_duration_seconds_bucket",
                "translate_batch_rows_bucket",
                "translate_decode_steps_total",
                "translate_generated_tokens_total",
            ):
                assert name in text

    run(main())


def test_cors_and_docs(tmp_path: Path) -> None:
    app = fake_app(tmp_path, cors_origins="https://example.org")

    async def main() -> None:
        async with serving(app) as client:
            response = await client.options(
                "/translate",
                headers={
                    "origin": "https://example.org",
                    "access-control-request-method": "POST",
                },
            )
            assert response.headers["access-control-allow-origin"] == "https://example.org"
            assert (await client.get("/docs")).status_code == 200
            schema = (await client.get("/openapi.json")).json()
            body = schema["paths"]["/translate"]["post"]["requestBody"]
            assert "text" in body["content"]["application/json"]["schema"]["properties"]

    run(main())


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_QUEUE", "7")
    monkeypatch.setenv("API_KEYS", " a , b,")
    monkeypatch.setenv("BATCHING", "false")
    monkeypatch.setenv("LOG_LEVEL", "WARNING")
    settings = Settings()
    assert (settings.max_queue, settings.api_keys, settings.batching) == (7, ["a", "b"], False)
    assert settings.log_level == "warning"
    assert "api_keys" not in repr(settings)  # keys stay out of logged settings
    assert Settings.model_fields["model_dir"].default.name == "models"


def test_json_logs(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    logging.config.dictConfig(logging_config(Settings(log_json=True, log_level="info")))
    try:
        logging.getLogger("service").info("hello %s", "there")
        entry = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert (entry["level"], entry["logger"], entry["message"]) == (
            "info",
            "service",
            "hello there",
        )
    finally:
        root.handlers[:], root.level = saved


# -- with a real server ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@asynccontextmanager
async def uvicorn_server(app: FastAPI) -> AsyncIterator[tuple[Server, str]]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=app.state.service.settings.shutdown_grace_s)
    server = Server(config, app.state.service)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(500):
            try:
                if (await client.get("/ready")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.02)
    try:
        yield server, url
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive()


def test_a_client_hanging_up_frees_its_rows(tmp_path: Path) -> None:
    app = fake_app(tmp_path, engine_kwargs={"step_s": 0.03}, shutdown_delay_s=0)
    long_text = " ".join(f"w{i}" for i in range(60))  # ~2 s of decoding

    async def main() -> None:
        async with uvicorn_server(app) as (_, url):
            async with httpx.AsyncClient(base_url=url, timeout=0.3) as client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.post("/translate", json={"text": long_text})
            scheduler = app.state.service.scheduler
            assert await asyncio.to_thread(scheduler.wait_idle, 1.0)
            assert len(engine_of(app).removed) == 1
            async with httpx.AsyncClient(base_url=url) as client:
                metrics = (await client.get("/metrics")).text
            assert 'route="/translate",status="499"' in metrics

    run(main())


# -- the real tiny model --------------------------------------------------------------------------


def fixture_pairs() -> list[tuple[str, str]]:
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")[:2]) for line in lines if line.strip()]  # type: ignore[misc]


@pytest.fixture
def real_app(tiny_bundle: Path) -> FastAPI:
    return create_app(Settings(model_dir=tiny_bundle, device="cpu", threads=1))


def test_real_round_trip(real_app: FastAPI) -> None:
    pairs = fixture_pairs()

    async def main() -> None:
        async with serving(real_app) as client:
            languages = (await client.get("/languages")).json()["pairs"]
            assert len(languages) == 1
            (source, target), (source2, target2) = pairs[0], pairs[1]
            response = await client.post("/translate", json={"text": source})
            assert response.json()["translations"][0]["text"] == target
            text = f"  {source} {source2}\n\n{pairs[2][0]}\n"
            response = await client.post(
                "/translate", json={"text": [text, "  "], "return_scores": True}
            )
            first, blank = response.json()["translations"]
            assert first["text"] == f"  {target} {target2}\n\n{pairs[2][1]}\n"
            assert first["score"] <= 0
            assert blank == {"text": "  "}
            response = await client.post(
                "/translate", json={"text": source, "beam_size": 3, "num_alternatives": 2}
            )
            result = response.json()["translations"][0]
            assert result["text"] == target
            assert 1 <= len(result["alternatives"]) <= 2

    run(main())


def test_real_overlong_input_is_split_and_translated(real_app: FastAPI, tiny_bundle: Path) -> None:
    async def main() -> None:
        async with serving(real_app) as client:
            engine = real_app.state.service.engines[("en", "de")]
            sentence = " ".join(["the cat is sleeping on the sofa"] * 40)
            assert len(engine.tokenize(sentence)) > engine.max_source_tokens
            response = await client.post("/translate", json={"text": sentence, "max_length": 8})
            assert response.status_code == 200
            assert response.json()["translations"][0]["text"]

    run(main())


def test_max_length_ratio_and_length_penalty_reach_the_search(real_app: FastAPI) -> None:
    """A request's max_length_ratio caps each sentence's output at ratio x source tokens + 10,
    and its length_penalty is the one beam search ranks by (as Engine.translate with them)."""
    source = fixture_pairs()[0][0]

    async def main() -> None:
        # The reference decodes run in a thread: on the event loop they would hold it past
        # MAX_LOOP_LAG_S on a loaded machine, and the next request would get 503.
        async def offline(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(engine.translate, *args, **kwargs)

        async with serving(real_app) as client:
            engine = real_app.state.service.engines[("en", "de")]
            for ratio in (0.01, 4.0):
                response = await client.post("/translate", json={
                    "text": source, "beam_size": 1, "max_length_ratio": ratio})
                assert response.status_code == 200
                text = response.json()["translations"][0]["text"]
                expected = (await offline([source], beam_size=1, max_length_ratio=ratio))[0]
                assert text == expected.text
            capped = (await offline([source], beam_size=1, max_length_ratio=0.01))[0]
            assert len(capped.hypotheses[0].token_ids) <= 10
            assert capped.text != (await offline([source], beam_size=1))[0].text
            # A sentence whose 4-best order the penalty changes, so the check can fail.
            sources = [pair[0] for pair in fixture_pairs()]
            ranked = {penalty: [[h.text for h in t.hypotheses] for t in await offline(
                sources, beam_size=4, num_hypotheses=4, length_penalty=penalty)]
                for penalty in (0.0, 4.0)}
            changed = [i for i in range(len(sources)) if ranked[0.0][i] != ranked[4.0][i]]
            assert changed, "the length penalty changes no fixture sentence's 4-best"
            for penalty in (0.0, 4.0):
                response = await client.post("/translate", json={
                    "text": sources[changed[0]], "beam_size": 4, "num_alternatives": 3,
                    "length_penalty": penalty})
                result = response.json()["translations"][0]
                texts = [result["text"]] + [a["text"] for a in result["alternatives"]]
                assert texts == ranked[penalty][changed[0]]

    run(main())


def test_64_concurrent_requests_equal_64_sequential_ones(real_app: FastAPI) -> None:
    pairs = fixture_pairs()
    bodies = [
        {"text": pairs[i % len(pairs)][0], "beam_size": 1 + i % 3, "return_scores": True}
        for i in range(64)
    ]

    async def main() -> None:
        async with serving(real_app) as client:
            sequential = [(await client.post("/translate", json=b)).json() for b in bodies]
            concurrent = await asyncio.gather(*(client.post("/translate", json=b) for b in bodies))
            concurrent_json = [r.json() for r in concurrent]
            for seq, con in zip(sequential, concurrent_json, strict=True):
                assert con["translations"][0]["text"] == seq["translations"][0]["text"]
                assert con["translations"][0]["score"] == pytest.approx(
                    seq["translations"][0]["score"], abs=1e-4
                )
            steps = real_app.state.service.metrics.registry.get_sample_value
            assert steps("translate_batch_rows_sum", {"pair": "en-de"}) > steps(
                "translate_batch_rows_count", {"pair": "en-de"}
            )  # some steps really ran several rows

    run(main())


def test_real_short_request_finishes_while_a_long_batch_runs(real_app: FastAPI) -> None:
    pairs = fixture_pairs()
    # Five fixture sentences run together make one long sentence (no inner full stops, so the
    # splitter keeps it whole); 48 of them with beam 4 fill the batch several times over.
    long_texts = [
        ", ".join(s.rstrip(".?!") for s, _ in (pairs * 2)[i : i + 5]) + "." for i in range(0, 48)
    ]

    async def main() -> None:
        async with serving(real_app) as client:
            order: list[str] = []

            async def post(name: str, body: dict) -> httpx.Response:
                response = await client.post("/translate", json=body)
                order.append(name)
                return response

            long = asyncio.create_task(
                post("long", {"text": long_texts, "beam_size": 4, "max_length": 256})
            )
            scheduler = real_app.state.service.scheduler
            while not scheduler.in_flight:
                await asyncio.sleep(0.001)
            short = await post("short", {"text": pairs[0][0]})
            assert short.json()["translations"][0]["text"] == pairs[0][1]
            assert (await long).status_code == 200
            assert order == ["short", "long"]

    run(main())


def test_no_repeat_ngram_size_from_request_else_setting_else_the_bundle() -> None:
    from service.translator import TranslateOptions, fixed_options

    settings = Settings(no_repeat_ngram_size=3)
    assert fixed_options(TranslateOptions(), settings)["no_repeat_ngram_size"] == 3
    request = TranslateOptions(no_repeat_ngram_size=0)
    assert fixed_options(request, settings)["no_repeat_ngram_size"] == 0
    # Unset: the engine fills it in from its bundle's recommendation.
    assert "no_repeat_ngram_size" not in fixed_options(TranslateOptions(), Settings())


def test_beam_size_from_request_else_the_setting() -> None:
    from service.translator import TranslateOptions, fixed_options

    assert fixed_options(TranslateOptions(), Settings())["beam_size"] == 2
    assert fixed_options(TranslateOptions(), Settings(default_beam=1))["beam_size"] == 1
    request = TranslateOptions(beam_size=4)
    assert fixed_options(request, Settings(default_beam=1))["beam_size"] == 4
    # Alternatives need a wider beam than the default: the beam grows to fit them.
    request = TranslateOptions(num_alternatives=3)
    assert fixed_options(request, Settings())["beam_size"] == 4
