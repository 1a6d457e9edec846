"""One request pipeline under three API shapes: the same situation gets the same decision in
the service's own API, LibreTranslate's and DeepL's, each answered in that API's own status
and error shape. Run against ``FakeEngine`` bundles (``tests.test_api``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_api import fake_app, run, serving


@dataclass(frozen=True)
class Api:
    """How one API is called, where it keeps the key, and its status for each situation."""

    name: str
    path: str
    body: Callable[..., dict[str, Any]]  # (texts, **extra) -> JSON body
    key: Callable[[str], tuple[dict[str, str], dict[str, Any]]]  # key -> (headers, fields)
    translations: Callable[[dict[str, Any]], list[str]]
    statuses: dict[str, int]

    def post(self, client: httpx.AsyncClient, texts: str | list[str], key: str | None = None,
             **extra: Any):
        headers, fields = self.key(key) if key is not None else ({}, {})
        return client.post(self.path, json={**self.body(texts, **extra), **fields},
                           headers=headers)

    def error(self, response: httpx.Response, situation: str) -> str:
        """The message of an error answered in this API's own shape, with its status."""
        assert response.status_code == self.statuses[situation], (situation, response.text)
        body = response.json()
        if self.name == "native":
            assert set(body) == {"error"} and set(body["error"]) >= {"code", "message"}, body
            return body["error"]["message"]
        key = "error" if self.name == "libretranslate" else "message"
        assert set(body) == {key} and isinstance(body[key], str) and body[key], body
        return body[key]


def _native_body(texts: str | list[str], **extra: Any) -> dict[str, Any]:
    return {"text": texts, **extra}


def _libre_body(texts: str | list[str], target: str = "de", **extra: Any) -> dict[str, Any]:
    if "num_alternatives" in extra:
        extra["alternatives"] = extra.pop("num_alternatives")
    if "target_lang" in extra:
        target = extra.pop("target_lang")
    return {"q": texts, "source": "en", "target": target, **extra}


def _deepl_body(texts: str | list[str], **extra: Any) -> dict[str, Any]:
    if extra.pop("format", None) == "html":
        extra["tag_handling"] = "html"
    return {"text": [texts] if isinstance(texts, str) else texts, "target_lang": "DE", **extra}


def _first(values: Any) -> list[str]:
    return values if isinstance(values, list) else [values]


APIS = [
    Api("native", "/translate", _native_body,
        lambda key: ({"Authorization": f"Bearer {key}"}, {}),
        lambda body: [t["text"] for t in body["translations"]],
        {"missing_key": 401, "bad_key": 401, "too_long": 413, "unsupported_pair": 422,
         "html_alternatives": 422, "malformed": 400, "wrong_type": 422}),
    Api("libretranslate", "/libretranslate/translate", _libre_body,
        lambda key: ({}, {"api_key": key}),
        lambda body: _first(body["translatedText"]),
        {"missing_key": 400, "bad_key": 403, "too_long": 400, "unsupported_pair": 400,
         "html_alternatives": 400, "malformed": 400, "wrong_type": 400}),
    Api("deepl", "/v2/translate", _deepl_body,
        lambda key: ({"Authorization": f"DeepL-Auth-Key {key}"}, {}),
        lambda body: [t["text"] for t in body["translations"]],
        {"missing_key": 403, "bad_key": 403, "too_long": 413, "unsupported_pair": 400,
         "malformed": 400, "wrong_type": 400}),
]
SHARED = {"queue_full": 429, "rate_limited": 429, "timeout": 504, "shutting_down": 503,
          "unknown_route": 404, "overloaded": 503}
for _api in APIS:
    _api.statuses.update(SHARED)

by_api = pytest.mark.parametrize("api", APIS, ids=[api.name for api in APIS])


@by_api
def test_keys_are_checked_alike(api: Api, tmp_path: Path) -> None:
    app = fake_app(tmp_path, api_keys=["right"])

    async def main() -> None:
        async with serving(app) as client:
            assert api.error(await api.post(client, "hello"), "missing_key")
            assert api.error(await api.post(client, "hello", key="wrong"), "bad_key")
            good = await api.post(client, "hello", key="right")
            assert good.status_code == 200, good.text
            assert api.translations(good.json()) == ["HELLO"]

    run(main())


@by_api
def test_wrong_keys_from_one_address_are_throttled(api: Api, tmp_path: Path) -> None:
    """Past FAILED_KEYS_PER_MINUTE wrong keys an address gets 429 with Retry-After for any key
    not yet right from there, so a guesser cannot tell a hit from a miss; a key that was
    right from that address (a client beside the guesser behind one proxy) goes on working."""
    app = fake_app(tmp_path, api_keys=["right", "other"], failed_keys_per_minute=3)

    async def main() -> None:
        async with serving(app) as client:
            assert (await api.post(client, "a", key="right")).status_code == 200
            for guess in range(3):
                assert api.error(await api.post(client, "a", key=f"guess{guess}"), "bad_key")
            for key in ("guess9", "other", ""):
                response = await api.post(client, "a", key=key)
                assert api.error(response, "rate_limited"), key
                assert int(response.headers["retry-after"]) >= 1
            assert (await api.post(client, "a", key="right")).status_code == 200

    run(main())


@by_api
def test_limits_pairs_and_options_are_refused_alike(api: Api, tmp_path: Path) -> None:
    app = fake_app(tmp_path, max_chars=10)

    async def main() -> None:
        async with serving(app) as client:
            message = api.error(await api.post(client, "x" * 11), "too_long")
            assert "10" in message
            response = await api.post(client, "hello", target_lang="fr")
            assert api.error(response, "unsupported_pair")
            if "html_alternatives" in api.statuses:  # DeepL's API has no alternatives
                response = await api.post(client, "<b>hi</b>", format="html",
                                          num_alternatives=1, beam_size=2) if (
                    api.name == "native") else await api.post(
                    client, "<b>hi</b>", format="html", num_alternatives=1)
                assert "html" in api.error(response, "html_alternatives")

    run(main())


MALFORMED = {
    "bad utf-8": b'{"X": "\xff\xfe"}',
    "lone surrogate escape": b'{"X": "\\ud800"}',
    "CESU-encoded surrogate": '{"X": "\ud83d\ude00"}'.encode("utf-8", "surrogatepass"),
    "deep JSON": b"[" * 100_000 + b"]" * 100_000,
}


@by_api
@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_bodies_get_a_400_never_a_500(api: Api, case: str, tmp_path: Path) -> None:
    app = fake_app(tmp_path)
    text_field = {"native": "text", "libretranslate": "q", "deepl": "text"}[api.name]
    fields = api.body("hello")

    async def main() -> None:
        async with serving(app) as client:
            body = MALFORMED[case]
            if b'"X"' in body:  # the text field itself carries the bad string
                others = {k: v for k, v in fields.items() if k != text_field}
                prefix = httpx.Request("POST", "/", json=others).content[:-1]
                body = prefix + b", " + body[1:].replace(b'"X"', f'"{text_field}"'.encode())
            response = await client.post(api.path, content=body,
                                         headers={"Content-Type": "application/json"})
            assert api.error(response, "malformed")
            for wrong in ({**fields, text_field: 5}, ["a"]):  # well-formed, wrong shape
                assert api.error(await client.post(api.path, json=wrong), "wrong_type")

    run(main())


@by_api
@pytest.mark.parametrize("text", ["\u0000\u0001\u0002", "\u0007", "\u200b\u200b", "\ufeff"],
                         ids=["controls", "bell", "zero-width spaces", "BOM"])
def test_text_with_nothing_to_translate_comes_back_as_itself(api: Api, text: str,
                                                             tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            response = await api.post(client, [text, "a b"])
            assert response.status_code == 200, response.text
            assert api.translations(response.json()) == [text, "A B"]

    run(main())


@by_api
def test_queue_full_is_429_with_retry_after(api: Api, tmp_path: Path) -> None:
    app = fake_app(tmp_path, engine_kwargs={"step_s": 0.005}, max_queue=3, max_batch_rows=1)

    async def main() -> None:
        async with serving(app) as client:
            texts = [f"t{i} u{i} v{i}" for i in range(30)]
            responses = await asyncio.gather(*(api.post(client, text) for text in texts))
            refused = [r for r in responses if r.status_code != 200]
            assert refused and len(refused) < len(texts)
            for response in refused:
                assert api.error(response, "queue_full")
                assert int(response.headers["retry-after"]) >= 1

    run(main())


@by_api
def test_rate_limited_is_429_with_retry_after(api: Api, tmp_path: Path) -> None:
    app = fake_app(tmp_path, requests_per_minute=1)

    async def main() -> None:
        async with serving(app) as client:
            assert (await api.post(client, "one")).status_code == 200
            response = await api.post(client, "two")
            assert api.error(response, "rate_limited")
            assert int(response.headers["retry-after"]) >= 1

    run(main())


@by_api
def test_a_passed_deadline_is_504(api: Api, tmp_path: Path) -> None:
    app = fake_app(tmp_path, engine_kwargs={"step_s": 0.005}, request_timeout_s=0.1)

    async def main() -> None:
        async with serving(app) as client:
            response = await api.post(client, " ".join(f"w{i}" for i in range(60)))
            assert api.error(response, "timeout")

    run(main())


@by_api
def test_a_lagging_event_loop_sheds_new_requests_with_503(api: Api, tmp_path: Path) -> None:
    """Requests arriving faster than the loop can read them are refused at once, before any
    work, rather than left waiting until their clients give up; the loop caught up, they are
    served again."""
    app = fake_app(tmp_path, max_loop_lag_s=0.1)
    lag = app.state.service.loop_lag

    async def main() -> None:
        async with serving(app) as client:
            assert (await api.post(client, "before")).status_code == 200

            async def hog() -> None:  # a loop kept busy: every callback runs 0.3 s late
                while lag.seconds <= 0.1:
                    time.sleep(0.3)
                    await asyncio.sleep(0)

            await asyncio.wait_for(hog(), 30)
            response = await api.post(client, "during")
            assert api.error(response, "overloaded")
            assert int(response.headers["retry-after"]) >= 1
            while lag.seconds > 0.1:
                await asyncio.sleep(0.05)
            assert (await api.post(client, "after")).status_code == 200

    run(main())


@by_api
def test_shutting_down_is_503(api: Api, tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            app.state.service.start_draining()
            response = await api.post(client, "hello")
            assert api.error(response, "shutting_down")
            assert response.headers["retry-after"]

    run(main())


@by_api
def test_unknown_routes_answer_in_the_apis_shape(api: Api, tmp_path: Path) -> None:
    app = fake_app(tmp_path)
    base = api.path.rsplit("/", 1)[0]

    async def main() -> None:
        async with serving(app) as client:
            assert api.error(await client.get(f"{base}/no-such-route"), "unknown_route")
            if api.name == "deepl":  # DeepL's newer routes, under v3, in its shape too
                assert api.error(await client.get("/v3/style_rules"), "unknown_route")

    run(main())


def test_libretranslate_health_and_spec(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            health = await client.get("/libretranslate/health")
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            wrong_method = await client.post("/libretranslate/health")
            assert wrong_method.status_code == 405 and set(wrong_method.json()) == {"error"}
            spec = await client.get("/libretranslate/spec")
            assert spec.status_code == 200
            assert "/libretranslate/translate" in spec.json()["paths"]

    run(main())


def test_deepl_model_type_and_split_sentences(tmp_path: Path) -> None:
    app = fake_app(tmp_path)

    async def main() -> None:
        async with serving(app) as client:
            for asked, used in [("quality_optimized", "quality_optimized"),
                                ("prefer_quality_optimized", "quality_optimized"),
                                ("latency_optimized", "latency_optimized")]:
                response = await client.post("/v2/translate", json={
                    "text": ["a"], "target_lang": "DE", "model_type": asked})
                assert response.json()["translations"][0]["model_type_used"] == used
            plain = await client.post("/v2/translate", json={"text": ["a"], "target_lang": "DE"})
            assert "model_type_used" not in plain.json()["translations"][0]
            for value in ("0", "1", "nonewlines"):
                response = await client.post("/v2/translate", json={
                    "text": ["a"], "target_lang": "DE", "split_sentences": value})
                assert response.status_code == 200, response.text
            response = await client.post("/v2/translate", json={
                "text": ["a"], "target_lang": "DE", "split_sentences": "invalid"})
            assert response.status_code == 400 and "split_sentences" in response.json()["message"]
            for field in ("style_id", "custom_instructions"):  # refused, not ignored
                response = await client.post("/v2/translate", json={
                    "text": ["a"], "target_lang": "DE", field: "x"})
                assert response.status_code == 400 and field in response.json()["message"]
            # A glossary needs source_lang, as DeepL's API says.
            response = await client.post("/v2/translate", json={
                "text": ["a"], "target_lang": "DE", "glossary_id": "x"})
            assert response.status_code == 400 and "source_lang" in response.json()["message"]
            usage = (await client.get("/v2/usage")).json()
            assert usage["character_limit"] > usage["character_count"]  # no cap: not reached

    run(main())


def test_detection_in_every_api(tmp_path: Path) -> None:
    """A source left to detection is detected among the sources of the target, in each API."""
    app = fake_app(tmp_path, "en-fr", "de-fr")
    german = "Das ist ein ganz normaler deutscher Satz über das Wetter und den Garten."

    async def main() -> None:
        async with serving(app) as client:
            native = await client.post("/translate", json={
                "text": german, "source_lang": "auto", "target_lang": "fr"})
            assert native.json()["source_lang"] == "de", native.text
            libre = await client.post("/libretranslate/translate", json={
                "q": german, "source": "auto", "target": "fr"})
            assert libre.json()["detectedLanguage"]["language"] == "de", libre.text
            deepl = await client.post("/v2/translate", json={"text": [german],
                                                              "target_lang": "FR"})
            assert deepl.json()["translations"][0]["detected_source_language"] == "DE"

    run(main())


def test_text_already_in_the_target_language_comes_back_unchanged(tmp_path: Path) -> None:
    """Left to detection, a text written in the target language is returned as it is, with
    that language as the detected one, in each API (as DeepL answers), instead of being read
    as the loaded source language; an English text beside it is still translated."""
    app = fake_app(tmp_path, "en-de")
    german = "Das ist ein ganz normaler deutscher Satz über das Wetter und den Garten."
    english = "This is a perfectly ordinary English sentence about the weather and the garden."

    async def main() -> None:
        async with serving(app) as client:
            deepl = await client.post("/v2/translate", json={"text": [german],
                                                              "target_lang": "DE"})
            assert deepl.json()["translations"][0] == {
                "detected_source_language": "DE", "text": german,
                "billed_characters": len(german)}, deepl.text
            deepl = await client.post("/v2/translate", json={"text": [english],
                                                              "target_lang": "DE"})
            answer = deepl.json()["translations"][0]
            assert answer["detected_source_language"] == "EN"
            assert answer["text"] == english.upper()  # the fake engine's translation
            libre = await client.post("/libretranslate/translate", json={
                "q": german, "source": "auto", "target": "de", "alternatives": 2})
            assert libre.json()["translatedText"] == german, libre.text
            assert libre.json()["detectedLanguage"]["language"] == "de"
            assert libre.json()["alternatives"] == []
            native = await client.post("/translate", json={
                "text": german, "source_lang": "auto", "target_lang": "de",
                "return_sentences": True, "return_scores": True})
            body = native.json()
            assert (body["source_lang"], body["target_lang"]) == ("de", "de"), native.text
            assert body["translations"][0]["text"] == german
            assert body["translations"][0]["sentences"] == [{"source": german, "text": german}]
            # Named explicitly, a pair no bundle serves is still refused.
            refused = await client.post("/translate", json={
                "text": german, "source_lang": "de", "target_lang": "de"})
            assert refused.status_code == 422

    run(main())


def test_a_pair_served_through_english_in_every_api(tmp_path: Path) -> None:
    """fr->de with bundles fr-en and en-de: two legs (each engine sees its own), listed as
    pivoted, refused when the request says so, and never chosen over a bundle of its own."""
    app = fake_app(tmp_path, "fr-en", "en-de", "de-en")

    async def main() -> None:
        async with serving(app) as client:
            engines = app.state.service.engines
            native = await client.post("/translate", json={
                "text": "<b>bonjour</b> monde https://example.org/x", "source_lang": "fr",
                "target_lang": "de", "format": "html"})
            assert native.status_code == 200, native.text
            body = native.json()
            assert body["translations"][0]["text"] == (
                "<b>BONJOUR</b> MONDE https://example.org/x")
            assert body["pivot_lang"] == "en"
            # The first leg saw the source, the second the first's translation.
            assert any("bonjour" in word for word in engines["fr", "en"].vocab)
            assert any("BONJOUR" in word for word in engines["en", "de"].vocab)
            refused = await client.post("/translate", json={
                "text": "a", "source_lang": "fr", "target_lang": "de", "pivot": False})
            assert refused.status_code == 422
            direct = await client.post("/translate", json={"text": "a", "source_lang": "de"})
            assert direct.json()["target_lang"] == "en" and "pivot_lang" not in direct.json()
            libre = await client.post("/libretranslate/translate", json={
                "q": "bonjour", "source": "fr", "target": "de"})
            assert libre.json()["translatedText"] == "BONJOUR"
            deepl = await client.post("/v2/translate", json={
                "text": ["bonjour"], "source_lang": "FR", "target_lang": "DE"})
            assert deepl.json()["translations"][0]["text"] == "BONJOUR"
            pairs = (await client.get("/languages")).json()["pairs"]
            pivoted = [p for p in pairs if p.get("pivot_lang")]
            assert pivoted == [{"source_lang": "fr", "target_lang": "de",
                                "model": "fr-en+en-de", "pivot_lang": "en"}]
            listed = {e["code"]: e["targets"]
                      for e in (await client.get("/libretranslate/languages")).json()}
            assert listed["fr"] == ["de", "en"]

    run(main())
