"""Glossaries: entries as DeepL's API sends them, terms matched and put back, a store that
outlives the process, and the official DeepL client and the service's own API applying them.

The served models are FakeEngine's (tests/test_scheduler.py: a "translation" is the words
upper-cased), so a glossary's target term shows as given while the words around it change."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.glossary import GlossaryError, GlossaryStore, Terms, parse_entries
from service.placeholders import protect
from tests.test_server import ServerProcess, fake_server

# -- entries ---------------------------------------------------------------------------------


def test_entries_are_read_from_tsv_and_csv_as_deepl_sends_them() -> None:
    assert parse_entries("Apple\tApfel\nBanana\tBanane\n") == {"Apple": "Apfel",
                                                               "Banana": "Banane"}
    csv = 'Apple,Apfel,en,de\n"Hello, world",Hallo Welt\n\n'
    assert parse_entries(csv, "csv") == {"Apple": "Apfel", "Hello, world": "Hallo Welt"}
    for bad, why in (("", "no entries"), ("Apple\n", "not a source and a target"),
                     ("Apple\tApfel\nApple\tApfelbaum", "repeats"),
                     (" Apple\tApfel", "surrounding spaces"), ("A\tB\tC", "not a source")):
        with pytest.raises(GlossaryError, match=why):
            parse_entries(bad)
    with pytest.raises(GlossaryError, match="MAX_GLOSSARY_ENTRIES"):
        parse_entries("a\tb\nc\td\n", max_entries=1)
    with pytest.raises(GlossaryError, match="tsv or csv"):
        parse_entries("a\tb", "xlsx")


def _large_bodies() -> list[tuple[str, str]]:
    """(what, body) of /translate bodies with a glossary of thousands of entries: valid ones
    with terms that look like the JSON around them, and ones each wrong in one place."""
    entries = {f"term {n}": f"Begriff {n}" for n in range(4000)}
    # Terms holding '",' throughout: where the parts are cut is often guessed inside one.
    awkward = {(f'say "hi", {n}' if n % 7 else f"a\\\", {n}"): f'sag "hallo", {n} }}{{'
               for n in range(4000)}
    awkward.update({"glossary": "Glossar", '"glossary": {': "é ✓ \u2028"})

    def body(glossary: dict[str, str], **fields: object) -> str:
        return json.dumps({"text": "Hello.", "target_lang": "de", "glossary": glossary,
                           **fields})

    plain = body(entries)
    return [
        ("plain", plain),
        ("awkward terms", body(awkward)),
        ("not ASCII-escaped, indented", json.dumps({"glossary": awkward, "text": ["a", "b"]},
                                                   ensure_ascii=False, indent=2)),
        ("glossary in a text", body(entries, text='the "glossary": {"a": "b"} field')),
        ("a term given twice", plain.replace('"term 3999"', '"term 7": "again", "term 3999"')),
        ("empty glossary, long text", body({}, text="word " * 20_000)),
        ("a number for a term", plain.replace('"Begriff 3000"', "3000")),
        ("an object for a term", plain.replace('"Begriff 3000"', '{"a": "b"}')),
        ("a lone surrogate", plain.replace("Begriff 3000", "Begriff \\ud800")),
        ("a bad escape", plain.replace("Begriff 3000", "Begriff \\q")),
        ("a trailing comma", plain.replace('"Begriff 3999"}', '"Begriff 3999",}')),
        ("glossary twice", plain[:-1] + ', "glossary": null}'),
        ("glossary twice, null first", plain.replace('"glossary": {',
                                                     '"glossary": null, "glossary": {')),
        ("an unknown field after it", plain[:-1] + ', "beamsize": 2}'),
        ("a wrong field before it", body(entries, beam_size="4")),
        ("unterminated", plain[:-1]),
    ]


@pytest.mark.parametrize(("what", "body"), _large_bodies(), ids=[w for w, _ in _large_bodies()])
def test_a_large_inline_glossary_is_read_as_one_pydantic_call_reads_it(what: str,
                                                                      body: str) -> None:
    """A large body's glossary is validated a part at a time (so that the thread parsing it
    hands the GIL on); the request, or the errors, are those of one call over the body."""
    from pydantic import ValidationError

    from service.api.schemas import TranslateRequest, translate_request

    def read(parse: Callable[[str], TranslateRequest]) -> tuple[Any, ...]:
        try:
            request = parse(body)
        except ValidationError as exc:
            return ("errors", exc.errors(include_url=False))
        return ("request", request, list(request.glossary or {}))  # the terms' order too

    assert read(translate_request) == read(TranslateRequest.model_validate_json)


def test_a_large_inline_glossary_is_validated_in_parts() -> None:
    from service.api.schemas import _parted

    for what, body in _large_bodies()[:5]:
        assert _parted(body) is not None, what


# -- matching --------------------------------------------------------------------------------


def test_terms_match_whole_words_longest_first_and_case_as_written() -> None:
    terms = Terms({"New York": "New York", "New York City": "NYC", "table": "Tisch",
                   "US": "USA", "e-mail": "E-Mail"})

    def found(text: str) -> list[str]:
        return [text[start:end] for start, end, _ in terms.find(text)]

    assert found("New York City has a Table, a table and tables.") == [
        "New York City", "Table", "table"]  # not "tables"
    assert found("Write to us in the US by e-mail.") == ["US", "e-mail"]  # not "us"
    assert [target for *_, target in terms.find("the TABLE")] == ["Tisch"]


def test_a_term_comes_back_as_its_target_whatever_the_model_does_with_it() -> None:
    terms = Terms({"artist": "Maler", "prize": "Gewinn"})
    protected = protect("The artist got a prize at https://artist.example/prize.",
                        terms=terms)
    # The URL is one item: its words are not glossary terms.
    assert protected.items == ("artist", "prize", "https://artist.example/prize")
    assert protected.text == "The {0} got a {1} at {2}."
    assert protected.restore("Der {0} bekam einen {1} bei {2}.").text == (
        "Der Maler bekam einen Gewinn bei https://artist.example/prize.")
    # A marker the model dropped is put back by rule, as the target term.
    assert "Gewinn" in protected.restore("Der {0} bekam etwas bei {2}.").text
    # Glossary terms alone, untranslatables left to the model.
    only = protect("The artist at https://artist.example", terms=terms,
                   untranslatables=False)
    assert only.text == "The {0} at https://artist.example"


def test_place_names_match_alone_as_written_and_a_glossary_comes_first() -> None:
    names = Terms({"Vienna": "Wien", "Milan": "Mailand", "Australia": "Australien"},
                  names=True)

    def found(text: str, terms: Terms = names) -> list[str]:
        return [target for *_, target in terms.find(text)]

    assert found("Milan or Vienna? Visit Australia!") == ["Mailand", "Wien", "Australien"]
    # Inside a longer name, as a possessive (the model inflects it) or in lower case: left.
    for text in ("The Vienna Philharmonic", "Milan Kundera wrote it.", "in Western Australia",
                 "South Australia", "Visit South Australia", "Vienna's museums",
                 "a vienna sausage"):
        assert found(text) == [], text
    # A request's glossary comes first; the place names fill in.
    assert found("Vienna and Milan", Terms({"vienna": "Vienna"}).over(names)) == [
        "Vienna", "Mailand"]



def test_a_large_glossary_finds_the_longest_term_whatever_automaton_holds_it() -> None:
    # Thousands of entries between the two: they land in different automata.
    entries = {"New York": "New York", **{f"filler{n}": "x" for n in range(10_000)},
               "New York City": "NYC", "table": "Tisch"}
    terms = Terms(entries)
    text = "Größe: the Table in New York City, STRASSE and New York."
    assert [(text[start:end], target) for start, end, target in terms.find(text)] == [
        ("Table", "Tisch"), ("New York City", "NYC"), ("New York", "New York")]
    # A character that folds to two ("ß" -> "ss") leaves the offsets after it right.
    folded = "Die STRAßE in Größe"
    assert [folded[a:b] for a, b, _ in Terms({"straße": "Straße", "in": "in"}).find(
        folded)] == ["STRAßE", "in"]


def test_a_glossary_is_compiled_once_per_content_off_the_event_loop() -> None:
    from service.glossary import compiled

    entries = {f"term{n}": f"Begriff{n}" for n in range(1000)}

    async def main() -> None:
        first, second = await asyncio.gather(compiled(entries), compiled(dict(entries)))
        assert first is second  # the same content, one compilation
        assert await compiled(entries) is first
        assert first.find("the term7 here") == [(4, 9, "Begriff7")]
        assert await compiled({**entries, "other": "andere"}) is not first

    asyncio.run(main())


def test_a_bundles_place_names_are_applied_unless_switched_off(tmp_path: Path) -> None:
    from service.settings import Settings
    from service.translator import Translator
    from tests.test_api import fake_factory, fake_models

    models = fake_models(tmp_path / "models", "en-de")
    build = fake_factory(step_s=0.001)

    def factory(directory: Path, settings: Settings) -> Any:
        engine = build(directory, settings)
        engine.bundle.terms = {"Munich": "München", "Vienna": "Wien"}
        return engine

    texts = ["We live in Munich.", "The Vienna Philharmonic plays.", "Munich's beer."]
    with Translator.load(Settings(model_dir=models, workers=1),
                         engine_factory=factory) as translator:
        # FakeEngine upper-cases: the place name shows as the bundle gives it.
        assert [r.text for r in translator.translate_batch(texts)] == [
            "WE LIVE IN München.", "THE VIENNA PHILHARMONIC PLAYS.", "MUNICH'S BEER."]
        kept = translator.translate_batch(texts[:1], glossary=Terms({"Munich": "Munich"}))
        assert kept[0].text == "WE LIVE IN Munich."
    with Translator.load(Settings(model_dir=models, workers=1, place_names=False),
                         engine_factory=factory) as translator:
        assert translator.translate_batch(texts[:1])[0].text == "WE LIVE IN MUNICH."


def test_a_place_names_second_pass_is_not_refused_when_the_queue_fills(tmp_path: Path) -> None:
    """The masked sentence's decode belongs to a request already accepted: others filling the
    queue meanwhile, or a drain, must not turn it into a 429 after the work was taken on."""
    from service.scheduler import QueueFull
    from service.settings import Settings
    from service.translator import TranslateOptions, Translator
    from tests.test_api import fake_factory, fake_models

    models = fake_models(tmp_path / "models", "en-de")
    build = fake_factory(step_s=0.02)

    def factory(directory: Path, settings: Settings) -> Any:
        engine = build(directory, settings)
        engine.bundle.terms = {"Munich": "München"}
        return engine

    with Translator.load(Settings(model_dir=models, workers=1, max_queue=4),
                         engine_factory=factory) as translator:
        scheduler = translator.scheduler

        async def main() -> str:
            task = asyncio.create_task(translator.translate(
                ["We live in Munich."], ("en", "de"), TranslateOptions()))
            while not scheduler.in_flight:  # its first pass is decoding
                await asyncio.sleep(0.002)
            held = []
            with pytest.raises(QueueFull):  # others take every place left
                while True:
                    held.append(scheduler.admit("en-de", 1))
            result = await task
            for admission in held:
                scheduler.release(admission)
            return result[0].text

        assert translator._event_loop().run(main()) == "WE LIVE IN München."


# -- the store -------------------------------------------------------------------------------


def test_glossaries_outlive_the_process_and_belong_to_their_key(tmp_path: Path) -> None:
    path = tmp_path / "data" / "glossaries.sqlite3"

    async def stored() -> bytes:
        return b"".join(p.read_bytes() for p in path.parent.iterdir())

    asyncio.run(glossaries_belong_to_their_key(lambda: GlossaryStore(path), stored))


KEY_ONE, KEY_TWO = "key-one-7f3a9c", "key-two-91bc0d"


async def glossaries_belong_to_their_key(open_store: Callable[[], Any],
                                         stored: Callable[[], Awaitable[bytes]]) -> None:
    """A store's glossaries, as written, read by the next store opened on the same place (a
    restarted process; another replica); ``stored``: everything the store holds, which must
    not give an owner's API key away."""
    store = open_store()
    made = await store.create("fruit", {("en", "de"): {"Apple": "Apfel", "Δぁ": "深"},
                                        ("de", "en"): {"Apfel": "apple"}}, owner=KEY_ONE)
    await store.create("other", {("en", "de"): {"a": "b"}}, owner=KEY_TWO)
    await store.close()
    again = open_store()
    assert await again.get(made.glossary_id, KEY_ONE) == made
    assert await again.get(made.glossary_id, KEY_TWO) is None
    assert [g.name for g in await again.list(KEY_ONE)] == ["fruit"]
    assert await again.count(KEY_TWO) == 1
    renamed = dataclasses.replace(made, name="fruits")
    assert await again.save(renamed) == renamed
    assert await again.get(made.glossary_id, KEY_ONE) == renamed
    held = await stored()
    assert b"fruits" in held  # what is stored is what was read
    assert KEY_ONE.encode() not in held and KEY_TWO.encode() not in held
    assert await again.delete(made.glossary_id, KEY_ONE)
    assert await again.get(made.glossary_id, KEY_ONE) is None
    assert not await again.delete(made.glossary_id, KEY_ONE)
    await again.close()


def test_glossaries_stored_with_their_owners_keys_are_read_and_the_keys_removed(
        tmp_path: Path) -> None:
    """A glossary file of the layout that kept each owner's key as it was."""
    path = tmp_path / "glossaries.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE glossaries (glossary_id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
               "name TEXT NOT NULL, creation_time TEXT NOT NULL, dictionaries TEXT NOT NULL)")
    db.execute("INSERT INTO glossaries VALUES (?, ?, ?, ?, ?)", (
        "2b8c2e4e-0d7e-4c55-9a6e-7f0e0c1d2e3f", KEY_ONE, "old", "2026-01-01T00:00:00.000Z",
        '[{"source_lang": "en", "target_lang": "de", "entries": {"apple": "Apfel"}}]'))
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()

    async def check() -> None:
        store = GlossaryStore(path)
        [glossary] = await store.list(KEY_ONE)
        assert glossary.name == "old" and glossary.dictionaries == {
            ("en", "de"): {"apple": "Apfel"}}
        assert await store.get(glossary.glossary_id, KEY_TWO) is None
        await store.close()

    asyncio.run(check())
    owners = sqlite3.connect(path).execute("SELECT owner FROM glossaries").fetchall()
    assert owners and KEY_ONE not in str(owners)


# -- through the APIs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("glossary")
    env = {"DATA_DIR": str(root / "data"), "API_KEYS": "k1,k2"}
    with fake_server(root, pairs=("en-de", "de-en", "fr-en"), env=env, step_s=0.001) as served:
        yield served


def test_the_official_deepl_client_manages_and_applies_glossaries(server: ServerProcess) -> None:
    import deepl

    client = deepl.Translator("k1", server_url=server.url)
    glossary = client.create_glossary("fruit", "EN", "DE", {"apple": "Apfel",
                                                           "green apple": "Grünapfel"})
    try:
        assert (glossary.source_lang, glossary.target_lang, glossary.entry_count) == (
            "EN", "DE", 2)
        assert client.get_glossary(glossary.glossary_id).creation_time == glossary.creation_time
        assert glossary.glossary_id in [g.glossary_id for g in client.list_glossaries()]
        assert client.get_glossary_entries(glossary) == {"apple": "Apfel",
                                                         "green apple": "Grünapfel"}
        result = client.translate_text(["An apple and a green apple.", "Apples."],
                                       source_lang="EN", target_lang="DE", glossary=glossary)
        assert [r.text for r in result] == ["AN Apfel AND A Grünapfel.", "APPLES."]
        # Another key neither sees nor uses it.
        other = deepl.Translator("k2", server_url=server.url)
        assert glossary.glossary_id not in [g.glossary_id for g in other.list_glossaries()]
        with pytest.raises(deepl.GlossaryNotFoundException):
            other.get_glossary(glossary.glossary_id)
        with pytest.raises(deepl.DeepLException, match="not found"):
            other.translate_text("apple", source_lang="EN", target_lang="DE",
                                 glossary=glossary.glossary_id)
        pairs = client.get_glossary_languages()
        assert {(p.source_lang, p.target_lang) for p in pairs} >= {("en", "de"), ("de", "en")}
        from_csv = client.create_glossary_from_csv("csv", "DE", "EN",
                                                   csv_data='Apfel,apple\n"Birne, reif",pear')
        assert client.get_glossary_entries(from_csv) == {"Apfel": "apple",
                                                        "Birne, reif": "pear"}
        client.delete_glossary(from_csv)
    finally:
        client.delete_glossary(glossary)
    with pytest.raises(deepl.GlossaryNotFoundException):
        client.get_glossary(glossary.glossary_id)
    with pytest.raises(deepl.DeepLException):
        client.get_glossary("not-an-id")
    with pytest.raises(deepl.DeepLException):
        client.create_glossary("bad", "EN", "XX", {"a": "b"})


def test_the_services_own_api_takes_a_glossary_by_id_or_inline(server: ServerProcess) -> None:
    headers = {"Authorization": "Bearer k1"}
    made = httpx.post(server.url + "/v2/glossaries", headers={
        "Authorization": "DeepL-Auth-Key k1"}, json={
        "name": "g", "source_lang": "en", "target_lang": "de", "entries": "table\tTisch",
        "entries_format": "tsv"})
    assert made.status_code == 201, made.text
    glossary_id = made.json()["glossary_id"]

    def translate(**fields) -> httpx.Response:
        return httpx.post(server.url + "/translate", headers=headers, json={
            "text": "The table at https://table.example", **fields})

    assert translate(source_lang="en", target_lang="de", glossary_id=glossary_id).json()[
        "translations"][0]["text"] == "THE Tisch AT https://table.example"
    assert translate(source_lang="en", target_lang="de", glossary={"The": "Der"}).json()[
        "translations"][0]["text"] == "Der TABLE AT https://table.example"
    wrong_pair = translate(source_lang="de", target_lang="en", glossary_id=glossary_id)
    assert wrong_pair.status_code == 422 and "en->de" in wrong_pair.json()["error"]["message"]
    missing = translate(source_lang="en", target_lang="de",
                        glossary_id="96ab91fd-e715-41a1-adeb-5d701f84a483")
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "glossary_id"
    through_english = translate(source_lang="fr", target_lang="de", glossary={"a": "b"})
    assert through_english.status_code == 422
    assert re.search(r"through en", through_english.json()["error"]["message"])
    both = translate(source_lang="en", target_lang="de", glossary={"a": "b"},
                     glossary_id=glossary_id)
    assert both.status_code == 422



def test_an_inline_glossary_is_limited_like_a_stored_one(server: ServerProcess) -> None:
    def translate(glossary: dict[str, str]) -> httpx.Response:
        return httpx.post(server.url + "/translate", headers={"Authorization": "Bearer k1"},
                          json={"text": "a table", "source_lang": "en", "target_lang": "de",
                                "glossary": glossary})

    for glossary, why in (({"table": "T" * 1025}, "over 1024 characters"),
                          ({" table": "Tisch"}, "surrounding spaces"),
                          ({"table": "Ti\nsch"}, "line break")):
        refused = translate(glossary)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["field"] == "glossary" and why in error["message"]
    assert translate({"table": "T" * 1024}).status_code == 200


def test_health_answers_while_a_glossary_of_100000_entries_is_applied(
        server: ServerProcess) -> None:
    """Compiling the terms once took the event loop for seconds, failing liveness probes: the
    probes are answered while it compiles, and the glossary applies. (How fast they are is
    measured by bench/chaos.py's glossary phase, not asserted here.)"""
    glossary = {f"entry{n} term": f"Eintrag{n}" for n in range(99_999)}
    glossary["table"] = "Tisch"
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, server.url + "/translate", headers={
            "Authorization": "Bearer k1"}, json={"text": "The table", "source_lang": "en",
                                                 "target_lang": "de", "glossary": glossary},
                             timeout=120)
        while not answer.done():
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
            time.sleep(0.05)
        translated = answer.result()
    assert translated.status_code == 200, translated.text
    assert translated.json()["translations"][0]["text"] == "THE Tisch"


def test_glossaries_survive_a_restart(tmp_path: Path) -> None:
    env = {"DATA_DIR": str(tmp_path / "data")}
    with fake_server(tmp_path / "first", env=env, step_s=0.001) as first:
        made = httpx.post(first.url + "/v2/glossaries", data={
            "name": "kept", "source_lang": "EN", "target_lang": "DE",
            "entries": "cat\tKatze"}).json()
    with fake_server(tmp_path / "second", env=env, step_s=0.001) as second:
        got = httpx.get(f"{second.url}/v2/glossaries/{made['glossary_id']}").json()
        assert got == made
        translated = httpx.post(second.url + "/v2/translate", data={
            "text": "the cat", "source_lang": "EN", "target_lang": "DE",
            "glossary_id": made["glossary_id"]}).json()
        assert translated["translations"][0]["text"] == "THE Katze"


def test_multilingual_glossaries_through_deepls_v3_client(server: ServerProcess) -> None:
    import deepl
    from deepl.api_data import MultilingualGlossaryDictionaryEntries as Dictionary

    client = deepl.DeepLClient("k1", server_url=server.url)
    glossary = client.create_multilingual_glossary("both ways", [
        Dictionary("EN", "DE", {"apple": "Apfel"}), Dictionary("DE", "EN", {"Birne": "pear"})])
    try:
        assert {(d.source_lang, d.target_lang, d.entry_count)
                for d in glossary.dictionaries} == {("EN", "DE", 1), ("DE", "EN", 1)}
        assert client.translate_text("one apple", source_lang="EN", target_lang="DE",
                                     glossary=glossary).text == "ONE Apfel"
        assert client.translate_text("eine Birne", source_lang="DE", target_lang="EN-GB",
                                     glossary=glossary.glossary_id).text == "EINE pear"
        entries = client.get_multilingual_glossary_entries(glossary, "EN", "DE")
        assert entries.dictionaries[0].entries == "apple\tApfel"
        # Merged into the dictionary, renamed, a dictionary replaced, one deleted.
        client.update_multilingual_glossary_dictionary(glossary, Dictionary(
            "EN", "DE", {"pear": "Birne"}))
        client.update_multilingual_glossary_name(glossary, "renamed")
        got = client.get_multilingual_glossary(glossary.glossary_id)
        assert got.name == "renamed"
        assert {(d.source_lang, d.entry_count) for d in got.dictionaries} == {
            ("EN", 2), ("DE", 1)}
        client.replace_multilingual_glossary_dictionary(glossary, Dictionary(
            "DE", "EN", {"Apfel": "apple", "Kiwi": "kiwi"}))
        client.delete_multilingual_glossary_dictionary(glossary, source_lang="EN",
                                                       target_lang="DE")
        got = client.get_multilingual_glossary(glossary.glossary_id)
        assert [(d.source_lang, d.entry_count) for d in got.dictionaries] == [("DE", 2)]
        # v2 glossaries are v3 glossaries of one dictionary, and the other way round.
        v2 = client.create_glossary("v2", "EN", "DE", {"a": "b"})
        assert v2.glossary_id in [g.glossary_id for g in client.list_multilingual_glossaries()]
        assert client.get_glossary(glossary.glossary_id).source_lang == "DE"
        client.delete_multilingual_glossary(v2.glossary_id)
    finally:
        client.delete_multilingual_glossary(glossary)
    with pytest.raises(deepl.GlossaryNotFoundException):
        client.get_multilingual_glossary(glossary.glossary_id)


def test_an_unusable_data_dir_is_a_503_naming_it(tmp_path: Path) -> None:
    from tests.test_api import fake_app

    blocked = tmp_path / "file"
    blocked.write_text("not a directory")

    async def check(client: httpx.AsyncClient) -> None:
        made = await client.post("/v2/glossaries", data={
            "name": "g", "source_lang": "EN", "target_lang": "DE", "entries": "a\tb"})
        assert made.status_code == 503
        assert "Glossaries are unavailable" in made.json()["message"]
        listed = await client.get("/v2/glossaries")
        assert listed.status_code == 503

    import asyncio

    from tests.test_api import serving

    async def main() -> None:
        async with serving(fake_app(tmp_path, data_dir=blocked / "data")) as client:
            await check(client)

    asyncio.run(main())


def test_stored_dictionaries_are_read_back_as_written_in_either_layout(tmp_path: Path) -> None:
    """A stored glossary's JSON is written an entry a line and read back a thousand lines
    at a time (a thread doing it hands the GIL on); it is JSON all the same, and a row
    written as one JSON line is read too."""
    import json

    from service.glossary import _dump, _load

    awkward = {f'term {n}, "quoted" \\ back,slash ,\\n': f"Ziel {n} ü ✓ \u2028"
               for n in range(2500)}
    dictionaries = {("en", "de"): awkward, ("en", "fr"): {"a": "b"}, ("de", "en"): {}}
    dumped = _dump(dictionaries)
    assert dumped.count("\n") >= len(awkward)  # an entry a line
    assert _load(dumped) == dictionaries
    assert {(d["source_lang"], d["target_lang"]): d["entries"]
            for d in json.loads(dumped)} == dictionaries
    one_line = json.dumps([{"source_lang": s, "target_lang": t, "entries": e}
                           for (s, t), e in dictionaries.items()], ensure_ascii=False)
    assert _load(one_line) == dictionaries

    async def through_the_store() -> None:
        store = GlossaryStore(tmp_path / "glossaries.sqlite3")
        made = await store.create("awkward", dictionaries)
        got = await store.get(made.glossary_id)
        assert got == made
        assert got is not None
        got.dictionaries.pop(("en", "fr"))  # a caller's change is its own
        assert await store.get(made.glossary_id) == made
        await store.close()

    asyncio.run(through_the_store())
