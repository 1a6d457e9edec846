"""The translator page's latency as a person sees it, measured in the browser, and its
screenshots.

Starts ``translate-serve`` on a bundle (sentence cache off, so every sentence is decoded), opens
the page in headless Chromium (tests/browser.py), types one-sentence texts from a held-out file
key by key, and reads the page's own Performance API measures: ``translation`` (the last
keystroke to the translation on screen, the page's debounce included) and
``translation-request`` (the request sent to the translation shown). Prints median and p90 of
each; never asserts. ``--screenshots DIR`` also saves the page at desktop and phone width.

    python bench/page.py                       # models/en-de, 20 sentences
    python bench/page.py --screenshots docs/images --sentences 40
    python bench/page.py --url http://localhost:8000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.placeholders import cpu_model, head_commit  # noqa: E402
from tests.browser import as_phone, chromium, missing  # noqa: E402

DEFAULT_TESTS = (ROOT / "runs/en-de/data/test.tsv", ROOT / "tests/fixtures/overfit.tsv")
SHOWCASE = ("The weather is nice today, so we are going for a walk in the park.\n"
            "Click a sentence to see other translations.")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(model_dir: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "CACHE_MB": "0", "LOG_LEVEL": "warning"}
    process = subprocess.Popen([sys.executable, "-m", "service.main", "--model-dir", model_dir,
                                "--port", str(port)], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(url + "/ready", timeout=2).status == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def one_sentence_texts(path: Path, count: int) -> list[str]:
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        source = line.split("\t")[0].strip()
        if 20 <= len(source) <= 120 and source[-1] in ".?!" and "\n" not in source:
            texts.append(source)
        if len(texts) == count:
            break
    return texts


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(driver, url: str, texts: list[str]) -> tuple[list[float], list[float]]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    WebDriverWait(driver, 30).until(
        lambda d: d.find_element(By.ID, "target-lang").get_attribute("value"))
    box = driver.find_element(By.ID, "source-text")
    totals, requests = [], []
    for text in texts:
        driver.execute_script("performance.clearMeasures()")
        box.clear()
        box.send_keys(text)
        WebDriverWait(driver, 60, poll_frequency=0.02).until(lambda d: d.execute_script(
            "return performance.getEntriesByName('translation').length"))
        total, request = driver.execute_script(
            "return ['translation', 'translation-request'].map("
            "name => performance.getEntriesByName(name).at(-1).duration)")
        totals.append(total)
        requests.append(request)
    return totals, requests


def screenshots(url: str, folder: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    folder.mkdir(parents=True, exist_ok=True)
    for name, phone, dark in (("page-desktop", False, False), ("page-phone", True, False),
                              ("page-desktop-dark", False, True)):
        with chromium(1100, 620) as driver:
            if phone:
                as_phone(driver, 390, 720)
            if dark:
                driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
                    "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
            driver.get(url + "/")
            WebDriverWait(driver, 30).until(
                lambda d: d.find_element(By.ID, "target-lang").get_attribute("value"))
            driver.find_element(By.ID, "source-text").send_keys(SHOWCASE)
            WebDriverWait(driver, 60).until(
                lambda d: d.find_element(By.ID, "translation").text)
            if not phone:  # the alternatives of the first sentence, open
                driver.find_elements(By.CSS_SELECTOR, ".sentence")[0].click()
                WebDriverWait(driver, 60).until(lambda d: d.find_elements(
                    By.CSS_SELECTOR, "#alternatives-list button"))
            time.sleep(0.3)  # the last paint
            driver.save_screenshot(str(folder / f"{name}.png"))
            print(f"saved {folder / name}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=str(ROOT / "models/en-de"))
    parser.add_argument("--url", help="measure a running server (its settings as they are)")
    parser.add_argument("--test", type=Path,
                        default=next((p for p in DEFAULT_TESTS if p.exists()), DEFAULT_TESTS[-1]))
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument("--screenshots", type=Path, help="save the page's screenshots here")
    args = parser.parse_args()
    why_not = missing()
    if why_not:
        sys.exit(f"no browser: {why_not}")
    texts = one_sentence_texts(args.test, args.sentences)
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(server(args.model_dir))
        with chromium() as driver:
            measure(driver, url, texts[:2])  # warm: the first requests load the page and pools
            totals, requests = measure(driver, url, texts)
        print(f"# bench/page.py  commit {head_commit()}  CPU: {cpu_model()}, {os.cpu_count()} "
              f"cores  texts: {len(texts)} one-sentence texts from {args.test.name}, typed")
        print("| measure (ms) | median | p90 | max |")
        print("|---|---:|---:|---:|")
        for label, values in (("last keystroke -> translation shown", totals),
                              ("request sent -> translation shown", requests)):
            print(f"| {label} | {statistics.median(values):.0f} | "
                  f"{percentile(values, 0.9):.0f} | {max(values):.0f} |")
        if args.screenshots:
            screenshots(url, args.screenshots)


if __name__ == "__main__":
    main()
