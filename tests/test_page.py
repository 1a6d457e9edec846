"""The translator's web page (``GET /``), as a person uses it: Debian's Chromium, driven through
its WebDriver, against a live server. The languages and swap tests serve FakeEngine bundles for
several pairs (their translation is the words upper-cased, their alternatives add "!"); the
typing test serves the real tiny model. What the page is made of (no request leaving the
server, its size) is checked over HTTP."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.api.page import FILES, SECURITY_HEADERS
from tests.browser import as_phone, chromium, missing
from tests.test_api import check_app
from tests.test_server import ServerProcess, fake_server, tiny_server

# -- what the page is made of (no browser) ---------------------------------------------------


def test_the_page_is_served_with_a_policy_that_keeps_it_to_this_server(
        tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        page = await client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == SECURITY_HEADERS[
            "Content-Security-Policy"]
        for name in ("page.js", "page.css", "icon.svg"):
            assert f"/page/{name}" in page.text
            asset = await client.get(f"/page/{name}")
            assert asset.status_code == 200
            assert "content-security-policy" in asset.headers
        # Revalidation: unchanged files cost a 304.
        again = await client.get("/", headers={"If-None-Match": page.headers["etag"]})
        assert again.status_code == 304
        assert (await client.get("/page/nothing.js")).status_code == 404
        settings = (await client.get("/page/settings")).json()
        assert settings == {"key_required": False, "max_chars": 123, "max_beam": 8,
                            "documents": [".docx", ".epub", ".htm", ".html", ".markdown",
                                          ".md", ".odp", ".odt", ".po", ".pot", ".pptx",
                                          ".srt", ".txt", ".vtt", ".xlf", ".xliff"],
                            "max_document_chars": 500_000}

    check_app(tiny_bundle, check, max_chars=123)


def test_the_page_can_be_turned_off(tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        assert (await client.get("/")).status_code == 404
        assert (await client.get("/page/page.js")).status_code == 404

    check_app(tiny_bundle, check, page=False)


def test_the_page_is_small_and_loads_nothing_from_elsewhere() -> None:
    assert sum(len(file.body) for file in FILES.values()) <= 100_000
    for name, file in FILES.items():
        text = file.body.decode()
        # No other origin: every URL the page names is a path on this server (the SVG's
        # namespace is a name, not a request).
        urls = re.findall(r"""(?:https?:)?//[\w.-]+""", text.replace(
            "http://www.w3.org/2000/svg", ""))
        assert urls == [], (name, urls)


# -- in a real browser ------------------------------------------------------------------------

WHY_NOT = missing()
browser = pytest.mark.skipif(WHY_NOT is not None, reason=f"no browser to drive: {WHY_NOT}")


@pytest.fixture(scope="module")
def pairs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with fake_server(tmp_path_factory.mktemp("page"), pairs=("en-de", "de-en", "en-fr"),
                     step_s=0.001) as server:
        yield server


@pytest.fixture(scope="module")
def driver() -> Iterator:
    if WHY_NOT is not None:
        pytest.skip(f"no browser to drive: {WHY_NOT}")
    with chromium() as driver:
        yield driver


def by_id(driver, name: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, name)


def wait(driver, condition, timeout: float = 20):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def options_of(driver, name: str) -> list[str]:
    from selenium.webdriver.support.ui import Select

    return [option.get_attribute("value") for option in Select(by_id(driver, name)).options]


def choose(driver, name: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(by_id(driver, name)).select_by_value(value)


def open_page(driver, server: ServerProcess) -> None:
    driver.get(server.url + "/")
    driver.execute_script("localStorage.clear()")
    driver.get(server.url + "/")
    wait(driver, lambda d: options_of(d, "target-lang"))


def type_text(driver, text: str) -> None:
    box = by_id(driver, "source-text")
    box.clear()
    box.send_keys(text)


def translation_becomes(driver, expected: str) -> None:
    try:
        wait(driver, lambda d: by_id(d, "translation").text == expected)
    except Exception:
        shown = by_id(driver, "translation").text
        error = by_id(driver, "error").text
        raise AssertionError(f"shown {shown!r}, error {error!r}; wanted {expected!r}") from None


def translate_on_page(driver, server: ServerProcess, pair: tuple[str, str], text: str,
                      expected: str) -> None:
    open_page(driver, server)
    choose(driver, "source-lang", pair[0])
    choose(driver, "target-lang", pair[1])
    type_text(driver, text)
    translation_becomes(driver, expected)


def console_errors(driver) -> list[str]:
    """Console errors other than the failed requests a test provoked on purpose."""
    return [entry["message"] for entry in driver.get_log("browser")
            if entry["level"] == "SEVERE" and "the server responded with a status" not in
            entry["message"]]


@browser
def test_typing_shows_the_translation_the_api_gives(tiny_bundle: Path, driver) -> None:
    with tiny_server(tiny_bundle) as server:
        text = "Where is the train station? My brother lives in Berlin."
        expected = httpx.post(server.url + "/translate", json={"text": text}).json()[
            "translations"][0]["text"]
        open_page(driver, server)
        type_text(driver, text)
        translation_becomes(driver, expected)
        assert by_id(driver, "counter").text == f"{len(text)} / 10,000"
        # A change while typing replaces the translation: the request under way is dropped.
        by_id(driver, "source-text").send_keys(" Please close the window.")
        expected = httpx.post(server.url + "/translate", json={
            "text": text + " Please close the window."}).json()["translations"][0]["text"]
        translation_becomes(driver, expected)
        assert driver.execute_script(
            "return performance.getEntriesByName('translation').length") >= 1
        assert console_errors(driver) == []


@browser
def test_the_language_lists_are_the_services_and_choices_are_remembered(
        pairs_server: ServerProcess, driver) -> None:
    pairs = httpx.get(pairs_server.url + "/languages").json()["pairs"]
    open_page(driver, pairs_server)
    sources = sorted({pair["source_lang"] for pair in pairs})
    assert sorted(options_of(driver, "source-lang")) == sorted(["auto", *sources])
    for source in sources:
        choose(driver, "source-lang", source)
        targets = {pair["target_lang"] for pair in pairs if pair["source_lang"] == source}
        assert set(options_of(driver, "target-lang")) == targets, source
    assert "fr" in options_of(driver, "target-lang")  # de->fr, through English
    choose(driver, "source-lang", "en")
    choose(driver, "target-lang", "fr")
    driver.refresh()
    wait(driver, lambda d: options_of(d, "target-lang"))
    assert by_id(driver, "source-lang").get_attribute("value") == "en"
    assert by_id(driver, "target-lang").get_attribute("value") == "fr"
    # Languages are named, not shown as codes.
    from selenium.webdriver.support.ui import Select

    assert Select(by_id(driver, "target-lang")).first_selected_option.text == "French"


@browser
def test_detected_language_is_shown_and_swap_reverses_the_pair(
        pairs_server: ServerProcess, driver) -> None:
    translate_on_page(driver, pairs_server, ("auto", "de"), "hello world", "HELLO WORLD")
    assert by_id(driver, "detected").text == "Detected: English"
    by_id(driver, "swap").click()
    wait(driver, lambda d: by_id(d, "source-lang").get_attribute("value") == "de")
    assert by_id(driver, "target-lang").get_attribute("value") == "en"
    assert by_id(driver, "source-text").get_attribute("value") == "HELLO WORLD"
    translation_becomes(driver, "HELLO WORLD")
    # fr->en is not served: no swap from en->fr.
    choose(driver, "source-lang", "en")
    choose(driver, "target-lang", "fr")
    wait(driver, lambda d: not by_id(d, "swap").is_enabled())


@browser
def test_an_alternative_replaces_its_sentence_by_mouse_and_by_keyboard(
        pairs_server: ServerProcess, driver) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    translate_on_page(driver, pairs_server, ("en", "de"), "Red green. Blue black.",
                      "RED GREEN. BLUE BLACK.")
    driver.find_elements(By.CSS_SELECTOR, ".sentence")[1].click()
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#alternatives-list button"))
    choices = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#alternatives-list button")]
    assert choices == ["BLUE BLACK.!", "BLUE BLACK.!!", "BLUE BLACK.!!!"]
    driver.find_elements(By.CSS_SELECTOR, "#alternatives-list button")[1].click()
    translation_becomes(driver, "RED GREEN. BLUE BLACK.!!")
    assert not by_id(driver, "alternatives").is_displayed()
    # Keyboard only: the sentence takes focus, Enter opens, arrows move, Enter chooses.
    first = driver.find_elements(By.CSS_SELECTOR, ".sentence")[0]
    driver.execute_script("arguments[0].focus()", first)
    first.send_keys(Keys.ENTER)
    wait(driver, lambda d: d.switch_to.active_element.tag_name == "button"
         and d.switch_to.active_element.text == "RED GREEN.!")
    driver.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    translation_becomes(driver, "RED GREEN.!! BLUE BLACK.!!")
    # The sentence's own translation is offered back once another was chosen.
    driver.find_elements(By.CSS_SELECTOR, ".sentence")[0].click()
    wait(driver, lambda d: "RED GREEN." in [
        b.text for b in d.find_elements(By.CSS_SELECTOR, "#alternatives-list button")])
    driver.switch_to.active_element.send_keys(Keys.ESCAPE)
    assert not by_id(driver, "alternatives").is_displayed()


@browser
def test_every_control_is_labelled_and_the_page_fits_a_phone(
        pairs_server: ServerProcess, driver) -> None:
    from selenium.webdriver.common.by import By

    open_page(driver, pairs_server)
    unlabelled = driver.execute_script("""
        return [...document.querySelectorAll('select, textarea, input, button')]
          .filter(el => !el.labels?.length && !el.getAttribute('aria-label')
                        && !el.textContent.trim())
          .map(el => el.id);""")
    assert unlabelled == []
    as_phone(driver)
    try:
        driver.refresh()
        wait(driver, lambda d: options_of(d, "target-lang"))
        width = driver.execute_script("return document.documentElement.clientWidth")
        assert width == 390
        assert driver.execute_script("return document.documentElement.scrollWidth") <= width
        panes = driver.find_elements(By.CSS_SELECTOR, ".pane")
        assert panes[1].location["y"] > panes[0].location["y"]  # stacked, not side by side
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@browser
def test_errors_are_told_in_plain_words(tmp_path: Path, driver) -> None:
    env = {"MAX_CHARS": "40", "REQUESTS_PER_MINUTE": "3"}
    with fake_server(tmp_path, env=env, step_s=0.001) as server:
        open_page(driver, server)
        type_text(driver, "x" * 45)
        wait(driver, lambda d: by_id(d, "error").is_displayed())
        assert by_id(driver, "error").text == (
            "The text is too long: 45 characters, at most 40 at once. Shorten it by 5.")
        assert "over" in by_id(driver, "counter").get_attribute("class")
        assert by_id(driver, "translation").text == ""
        # The fourth request in a minute is refused: told with the wait, not as JSON.
        for text in ("red", "green", "blue", "black"):
            type_text(driver, text)
            wait(driver, lambda d, text=text: by_id(d, "translation").text == text.upper()
                 or "Too many" in by_id(d, "error").text)
        message = by_id(driver, "error").text
        assert re.fullmatch(r"Too many requests\. Try again in \d+ seconds?\.", message), message
        assert "{" not in message


@browser
def test_a_service_with_keys_asks_for_one_and_remembers_it(tmp_path: Path, driver) -> None:
    with fake_server(tmp_path, env={"API_KEYS": "sesame"}, step_s=0.001) as server:
        driver.get(server.url + "/")
        driver.execute_script("localStorage.clear()")
        driver.get(server.url + "/")
        wait(driver, lambda d: by_id(d, "key-row").is_displayed())
        wait(driver, lambda d: by_id(d, "error").is_displayed())
        assert by_id(driver, "error").text == "This service needs an API key: enter yours above."
        key = by_id(driver, "api-key")
        key.send_keys("wrong")
        by_id(driver, "source-text").click()  # leaving the field applies it
        wait(driver, lambda d: "not accepted" in by_id(d, "error").text)
        key.clear()
        key.send_keys("sesame")
        by_id(driver, "source-text").click()
        wait(driver, lambda d: options_of(d, "target-lang") == ["de"])
        type_text(driver, "open sesame")
        translation_becomes(driver, "OPEN SESAME")
        driver.refresh()
        wait(driver, lambda d: options_of(d, "target-lang") == ["de"])
        assert by_id(driver, "api-key").get_attribute("value") == "sesame"


@browser
def test_no_key_field_when_the_service_needs_no_key(
        pairs_server: ServerProcess, driver) -> None:
    open_page(driver, pairs_server)
    assert not by_id(driver, "key-row").is_displayed()
    assert console_errors(driver) == []


@browser
def test_a_file_dropped_on_the_page_comes_back_translated(pairs_server: ServerProcess, driver,
                                                           tmp_path: Path) -> None:
    open_page(driver, pairs_server)
    choose(driver, "source-lang", "en")
    choose(driver, "target-lang", "de")
    assert by_id(driver, "files").is_displayed()
    notes = tmp_path / "notes.txt"
    notes.write_text("Hello world.\n\nSecond paragraph.\n")
    by_id(driver, "file-input").send_keys(str(notes))
    wait(driver, lambda d: by_id(d, "file-download").is_displayed())
    link = by_id(driver, "file-download")
    assert link.get_attribute("download") == "notes.de.txt"
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {
        "behavior": "allow", "downloadPath": str(downloads)})
    link.click()
    saved = downloads / "notes.de.txt"
    wait(driver, lambda d: saved.is_file() and saved.stat().st_size > 0)
    assert saved.read_text() == "HELLO WORLD.\n\nSECOND PARAGRAPH.\n"
    assert by_id(driver, "file-status").text == "notes.txt is translated."
    # A file of another kind is refused in words, before any upload.
    other = tmp_path / "sheet.xlsx"
    other.write_bytes(b"PK")
    by_id(driver, "file-input").send_keys(str(other))
    wait(driver, lambda d: by_id(d, "error").is_displayed())
    assert by_id(driver, "error").text == (
        "This service translates .docx, .epub, .htm, .html, .markdown, .md, .odp, .odt, .po, "
        ".pot, .pptx, .srt, .txt, .vtt, .xlf, .xliff files, not .xlsx.")
