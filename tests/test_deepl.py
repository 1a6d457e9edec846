"""The DeepL-compatible API, spoken to by the official ``deepl`` client pointed at the service
with ``server_url``, against the real tiny bundle."""

from __future__ import annotations

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
    env = {"API_KEYS": "k3y", "USAGE_LIMIT_CHARS": "100000"}
    with tiny_server(tiny_bundle, env=env) as process:
        yield process


def test_the_official_deepl_client(server: ServerProcess) -> None:
    import deepl

    client = deepl.Translator("k3y", server_url=server.url)
    source, target = PAIRS[4]
    result = client.translate_text(source, target_lang="DE")
    assert (result.text, result.detected_source_lang) == (target, "EN")
    assert result.billed_characters == len(source)
    both = client.translate_text([PAIRS[0][0], PAIRS[1][0]], source_lang="en",
                                 target_lang="de", formality="prefer_more")
    assert [r.text for r in both] == [PAIRS[0][1], PAIRS[1][1]]
    assert [(x.code, x.name) for x in client.get_source_languages()] == [("EN", "English")]
    targets = client.get_target_languages()
    assert [(x.code, x.supports_formality) for x in targets] == [("DE", False)]
    usage = client.get_usage()
    expected = len(source) + len(PAIRS[0][0]) + len(PAIRS[1][0])  # usage before the html one
    assert (usage.character.count, usage.character.limit) == (expected, 100000)
    assert not usage.any_limit_reached
    html = client.translate_text(f"<p><b>{source}</b></p>", target_lang="DE",
                                 tag_handling="html")
    assert html.text == f"<p><b>{target}</b></p>"
    # ignore_tags: the element's text stays as sent, in its place; without it, it is translated.
    kept = PAIRS[1][0]
    xml = f"<p>{source} <x>{kept}</x></p>"
    ignored = client.translate_text(xml, target_lang="DE", tag_handling="xml", ignore_tags=["x"])
    assert f"<x>{kept}</x>" in ignored.text and ignored.text.startswith("<p>")
    assert f"<x>{kept}</x>" not in client.translate_text(xml, target_lang="DE",
                                                         tag_handling="xml").text
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong", server_url=server.url).translate_text("a", target_lang="DE")
    with pytest.raises(deepl.DeepLException, match="formality"):
        client.translate_text(source, target_lang="DE", formality="more")


def test_form_bodies_regional_variants_and_errors(tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        source, target = PAIRS[5]
        form = await client.post("/v2/translate", content=(
            f"text={source}&text={source}&target_lang=DE-CH&source_lang=EN-US"),
            headers={"content-type": "application/x-www-form-urlencoded"})
        assert form.status_code == 200, form.text
        assert [t["text"] for t in form.json()["translations"]] == [target, target]
        kinds = await client.post("/v2/languages", data={"type": "target"})
        assert kinds.json() == [{"language": "DE", "name": "German",
                                 "supports_formality": False}]
        for fields, status in (({"text": ["a"], "target_lang": "FR"}, 400),
                               ({"target_lang": "DE"}, 400),
                               ({"text": ["a" * 10_001], "target_lang": "DE"}, 413),
                               ({"text": ["a"], "target_lang": "DE", "tag_handling": "pdf"},
                                400)):
            response = await client.post("/v2/translate", json=fields)
            assert response.status_code == status, (fields, response.text)
            assert set(response.json()) == {"message"}
        first = await client.post("/v2/translate", json={"text": ["abcdefghij"],
                                                         "target_lang": "DE"})
        assert first.status_code == 200
        spent = await client.post("/v2/translate", json={"text": ["abcdefghij"],
                                                         "target_lang": "DE"})
        assert spent.status_code == 456, spent.text
        usage = await client.get("/v2/usage")
        assert usage.json() == {"character_count": 2 * len(source) + 10, "character_limit": limit}

    limit = 2 * len(PAIRS[5][0]) + 15
    check_app(tiny_bundle, check, usage_limit_chars=limit)


def test_clients_with_different_keys_have_separate_budgets(tiny_bundle: Path) -> None:
    """The key counts as DeepL's clients send it: the DeepL-Auth-Key header, or the legacy
    auth_key field."""

    async def check(client: httpx.AsyncClient) -> None:
        fields = {"text": [PAIRS[0][0]], "target_lang": "DE"}

        async def status(key: str, in_header: bool) -> int:
            if in_header:
                response = await client.post("/v2/translate", json=fields,
                                             headers={"Authorization": f"DeepL-Auth-Key {key}"})
            else:
                response = await client.post("/v2/translate", json={**fields, "auth_key": key})
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
            return response.status_code

        for in_header in (True, False):
            first, second = ("alpha", "beta") if in_header else ("gamma", "delta")
            assert await status(first, in_header) == 200
            assert await status(first, in_header) == 429
            assert await status(second, in_header) == 200

    check_app(tiny_bundle, check, api_keys=["alpha", "beta", "gamma", "delta"],
              requests_per_minute=1)
