#!/usr/bin/env bash
# Debian's Chromium and its WebDriver, for the page's browser tests (tests/test_page.py) and
# bench/page.py. Installs only what is missing, and only as root (apt); elsewhere it says what
# to install and the browser tests skip with that message.
set -euo pipefail
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
  exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "install-browser: not root on Debian: install the packages chromium and chromium-driver" \
    "to run the browser tests (they skip without them)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium \
    chromium-driver >/dev/null; then
  /usr/bin/chromium --version
else
  echo "install-browser: apt-get could not install chromium and chromium-driver; the browser" \
    "tests will skip" >&2
fi
