"""The LibreTranslate-compatible API, spoken to by the real ``libretranslatepy`` client over
HTTP and by requests shaped as Mastodon sends them, against the real tiny bundle."""

from __future__ import annotations

import urllib.error
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_api import check_app
from tests.test_server import ServerProcess, tiny_server

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"
PAIRS = [line.split("\t") for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def server(tiny_bundle: Path) -> Iterator[ServerProcess]:
    with tiny_server(tiny_bundle) as process:
        yield process


def test_the_libretranslatepy_client_translates_detects_and_lists(server: ServerProcess) -> None:
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(server.url + "/libretranslate")
    source, target = PAIRS[2]
    assert client.translate(source, "en", "de") == target  # form-encoded, as the client sends
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]}]
    # Detected among the loaded source languages, with the detector's confidence in it.
    [detected] = client.detect(source)
    assert detected["language"] == "en" and detected["confidence"] > 50
    [german] = client.detect("Wo ist der Bahnhof? Ich suche den Zug nach München.")
    assert german["language"] == "en" and german["confidence"] < 10  # not English
    with pytest.raises(urllib.error.HTTPError) as refused:
        client.translate(source, "en", "fr")
    assert refused.value.code == 400


def test_a_request_shaped_as_mastodon_sends_it(tiny_bundle: Path) -> None:
    """JSON, q a list of HTML posts, source auto, format html, an api_key field (empty when
    none is configured)."""

    async def check(client: httpx.AsyncClient) -> None:
        sources = [f"<p>{PAIRS[0][0]}</p>",
                   f'<p>{PAIRS[1][0]}<br><a href="https://example.org/?a=1&amp;b=2" '
                   'class="mention">@someone</a></p>']
        response = await client.post("/libretranslate/translate", json={
            "q": sources, "source": "auto", "target": "de", "format": "html", "api_key": ""})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["translatedText"][0] == f"<p>{PAIRS[0][1]}</p>"
        second = body["translatedText"][1]
        assert second.startswith(f"<p>{PAIRS[1][1]}<br>")
        assert '<a href="https://example.org/?a=1&amp;b=2" class="mention">' in second
        assert second.endswith("</a></p>")
        first, second = body["detectedLanguage"]
        assert first == second and first["language"] == "en" and first["confidence"] > 50

    check_app(tiny_bundle, check)


def test_form_query_and_json_bodies_alternatives_and_errors(tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        source, target = PAIRS[3]
        url = "/libretranslate/translate"
        form = await client.post(url, data={"q": source, "source": "en", "target": "de"})
        assert form.json() == {"translatedText": target}
        query = await client.post(url, params={"q": source, "source": "en", "target": "de"})
        assert query.json() == {"translatedText": target}
        repeated = await client.post(url, content=f"q={source}&q={source}&source=en&target=de",
                                     headers={"content-type": "application/x-www-form-urlencoded"})
        assert repeated.json() == {"translatedText": [target, target]}
        alternatives = await client.post(url, json={"q": source, "source": "en", "target": "de",
                                                    "alternatives": 2})
        body = alternatives.json()
        assert body["translatedText"] == target and isinstance(body["alternatives"], list)
        assert target not in body["alternatives"] and len(body["alternatives"]) <= 2
        for fields, message in (
            ({"source": "en", "target": "de"}, "Invalid request: missing q parameter"),
            ({"q": "a", "target": "de"}, "Invalid request: missing source parameter"),
            ({"q": "a", "source": "en", "target": "xx"}, "xx is not supported"),
            ({"q": "a", "source": "en", "target": "de", "format": "pdf"},
             "pdf format is not supported"),
            ({"q": "a", "source": "en", "target": "de", "alternatives": "x"},
             "Invalid request: alternatives parameter is not a number"),
        ):
            response = await client.post(url, json=fields)
            assert (response.status_code, response.json()) == (400, {"error": message})
        too_long = await client.post(url, json={"q": "a" * 10_001, "source": "en",
                                                "target": "de"})
        assert too_long.status_code == 400 and "MAX_CHARS" in too_long.json()["error"]
        settings = await client.get("/libretranslate/frontend/settings")
        assert settings.json()["language"] == {"source": {"code": "en", "name": "English"},
                                               "target": {"code": "de", "name": "German"}}

    check_app(tiny_bundle, check)


def test_api_keys_as_libretranslate_checks_them(tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        url = "/libretranslate/translate"
        fields = {"q": PAIRS[0][0], "source": "en", "target": "de"}
        missing = await client.post(url, json=fields)
        assert missing.status_code == 400 and "API key" in missing.json()["error"]
        wrong = await client.post(url, json={**fields, "api_key": "nope"})
        assert (wrong.status_code, wrong.json()) == (403, {"error": "Invalid API key"})
        right = await client.post(url, json={**fields, "api_key": "s3cret"})
        assert right.json() == {"translatedText": PAIRS[0][1]}
        assert (await client.get("/libretranslate/frontend/settings")).json()["keyRequired"]

    check_app(tiny_bundle, check, api_keys=["s3cret"])


def test_a_client_over_its_limit_gets_a_slowdown_429(tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        fields = {"q": PAIRS[0][0], "source": "en", "target": "de"}
        first = await client.post("/libretranslate/translate", json=fields)
        assert first.status_code == 200, first.text
        response = await client.post("/libretranslate/translate", json=fields)
        assert response.status_code == 429, response.text
        assert response.json()["error"].startswith("Slowdown:")
        assert int(response.headers["retry-after"]) >= 1

    check_app(tiny_bundle, check, requests_per_minute=1)


def test_clients_with_different_keys_have_separate_budgets(tiny_bundle: Path) -> None:
    """LibreTranslate's clients send their key in the body, not as a bearer token."""

    async def check(client: httpx.AsyncClient) -> None:
        fields = {"q": PAIRS[0][0], "source": "en", "target": "de"}
        url = "/libretranslate/translate"
        first = await client.post(url, json={**fields, "api_key": "alpha"})
        assert first.status_code == 200, first.text
        spent = await client.post(url, json={**fields, "api_key": "alpha"})
        assert spent.status_code == 429, spent.text
        assert spent.json()["error"].startswith("Slowdown:")
        assert int(spent.headers["retry-after"]) >= 1
        other = await client.post(url, json={**fields, "api_key": "beta"})
        assert other.status_code == 200, other.text
        assert other.json() == {"translatedText": PAIRS[0][1]}

    check_app(tiny_bundle, check, api_keys=["alpha", "beta"], requests_per_minute=1)
