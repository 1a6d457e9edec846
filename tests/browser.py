"""Debian's Chromium driven through its WebDriver (``chromedriver``) with selenium, for the
page's tests (tests/test_page.py) and its latency script (bench/page.py). Installed by
``scripts/install-test-tools.sh`` (``.ci/run`` calls it); ``missing()`` says what is absent."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why no browser can be driven here, or None when one can."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if shutil.which(path) is None:
            return f"{path} not found: install Debian's {package} (scripts/install-test-tools.sh)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed: pip install -e '.[dev]'"
    return None


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator:
    """A headless Chromium with a fresh profile, its window ``width`` x ``height``, keeping
    the console's messages (``driver.get_log("browser")``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        # The flags that keep Chromium from calling out to the network at start, and run it as
        # root in a container (no sandbox, no GPU).
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run", "--disable-quic",
                     "--disable-default-apps", "--disable-extensions",
                     f"--user-data-dir={profile}", f"--window-size={width},{height}",
                     "--lang=en-US"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        try:
            yield driver
        finally:
            driver.quit()


def as_phone(driver, width: int = 390, height: int = 844) -> None:
    """Lay the page out as a phone of that many CSS pixels does (a window cannot be narrower
    than about 500 pixels, so the viewport is emulated)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 2, "mobile": True})
