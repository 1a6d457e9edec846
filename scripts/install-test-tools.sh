#!/usr/bin/env bash
# What the test suite drives besides Python: Debian's Chromium and its WebDriver (the page's
# browser tests, tests/test_page.py, and bench/page.py) and redis-server (replicas sharing
# state, tests/test_shared_state.py; never started as a system service, the tests start their
# own on loopback). Installs only what is missing, and only as root (apt); elsewhere it says
# what to install and the tests that need it skip with that message. gettext's msgfmt checks
# that translated catalogues still load (tests/test_documents.py, test_real_documents.py).
set -euo pipefail
missing=()
[[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] || missing+=(chromium chromium-driver)
[[ -x /usr/bin/redis-server ]] || missing+=(redis-server)
[[ -x /usr/bin/msgfmt ]] || missing+=(gettext)
if [[ ${#missing[@]} == 0 ]]; then
  exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "install-test-tools: not root on Debian: install the packages ${missing[*]} to run the" \
    "tests that need them (they skip without them)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d: the package's own service is not started (the tests start redis themselves).
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null; then
  /usr/bin/chromium --version
  /usr/bin/redis-server --version
else
  echo "install-test-tools: apt-get could not install ${missing[*]}; the tests that need" \
    "them will skip" >&2
fi
