#!/usr/bin/env bash
# Runs the API clients' OWN test suites against a running instance of this service, over
# loopback, and prints pass/fail/skip per suite:
#
#   libretranslate  LibreTranslate's tests/test_api, from the `libretranslate` sdist on PyPI
#                   (latest, or LT_VERSION). Its conftest.py (a Flask test client on LibreTranslate's
#                   own app) is replaced by scripts/peer/lt_conftest.py, an HTTP client with the
#                   same .get/.post surface pointed at http://127.0.0.1:PORT/libretranslate, and
#                   `"target": "es"` becomes `"target": "de"` in test_api_translate.py (the only
#                   pair served is en->de). Nothing else is changed. The server runs without
#                   API_KEYS, as LibreTranslate's own test app does.
#   deepl-python    deepl-python's tests/ (v1.30.0, vendored under scripts/peer/deepl-tests: the
#                   PyPI sdist ships no tests), unchanged, in real-server mode: DEEPL_SERVER_URL
#                   = http://127.0.0.1:PORT, DEEPL_AUTH_KEY=test-key, no DEEPL_MOCK_SERVER_PORT;
#                   the server runs with API_KEYS=test-key and USAGE_LIMIT_CHARS (1,000,000), so
#                   that invalid-key tests get 403 and /v2/usage reports a character limit.
#
#   bash scripts/peer-suites.sh            (exit 0 only when no failure is a protocol failure)
#
# Each failing test is put in one class by the table in scripts/peer/expected.py (read by
# scripts/peer/summarize.py): (a) protocol -- anything not listed there, or listed but failing
# without the entry's evidence; (b) unsupported feature, by feature (glossaries, documents, ...:
# what docs/api.md lists as not supported); (c) language pair not served (only EN->DE is);
# (d) model wording (the test compares with DeepL's own translation). Listed tests that pass are
# reported, so that the table stays honest. Per suite the classes, their counts and their
# failures are printed (for protocol failures with the traceback and the HTTP exchanges, which
# the pytest plugin scripts/peer/record_http.py records), and last one line per suite:
#   deepl-python: 47 passed, 98 failed, 21 skipped  (protocol 0, unsupported feature 49, ...)
#
# A throwaway virtualenv (pytest, pytest-timeout, requests, deepl==1.30.0, click, pydantic<2)
# is made once under PEER_CACHE and reused; the service itself runs from the project's .venv
# with the default model. Requests to anything but loopback are sent to a dead loopback proxy.
# Knobs (environment): PEER_CACHE (~/.cache/nmt-peer-suites), PEER_WORK (a fresh temp dir:
# copies of the suites, JUnit reports, logs), LT_VERSION (latest), PEER_SUITES ("libretranslate
# deepl-python"), PEER_TEST_TIMEOUT_S (60, per test), PEER_SUITE_TIMEOUT_S (900, per suite),
# PEER_READY_TIMEOUT_S (180), PEER_THREADS (1: onnxruntime threads of the server),
# PEER_PYTEST_ARGS (extra pytest arguments, e.g. "-k translate_text"), PEER_SERVE_REV (serve the
# service/ package of this git revision, e.g. HEAD, instead of the working tree: for when
# service/ is mid-edit; the models are still read from models/).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEER=$REPO/scripts/peer
PEER_CACHE=${PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nmt-peer-suites}
WORK=${PEER_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/peer-suites.XXXXXX")}
SUITES=${PEER_SUITES:-libretranslate deepl-python}
TEST_TIMEOUT_S=${PEER_TEST_TIMEOUT_S:-60}
SUITE_TIMEOUT_S=${PEER_SUITE_TIMEOUT_S:-900}
READY_TIMEOUT_S=${PEER_READY_TIMEOUT_S:-180}
THREADS=${PEER_THREADS:-1}
DEEPL_VERSION=1.30.0          # the version of the vendored tests (test_version checks it)
DEEPL_KEY=test-key
SERVE=$REPO/.venv/bin/translate-serve
VENV=$PEER_CACHE/venv
PY=$VENV/bin/python
T0=$SECONDS
SERVER_PID=

say() { printf '[peer %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { say "FAIL: $*" >&2; exit 2; }

stop_server() {
  [[ -n $SERVER_PID ]] || return 0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap 'stop_server' EXIT
trap 'exit 130' INT TERM

[[ -x $SERVE ]] || fail "no $SERVE: install the project first (make serve / pip install -e .)"
mkdir -p "$WORK" "$PEER_CACHE"
say "work directory: $WORK"

# ---- the clients' environment ---------------------------------------------------------------
REQS="pytest>=8,<10 pytest-timeout requests deepl==$DEEPL_VERSION click pydantic>=1.8.1,<2 typing_extensions"
if [[ ! -x $PY || "$(cat "$VENV/.peer-reqs" 2>/dev/null)" != "$REQS" ]]; then
  say "making the clients' virtualenv at $VENV"
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  # shellcheck disable=SC2086  # REQS is a list of requirement words
  "$PY" -m pip install -q --disable-pip-version-check $REQS >"$PEER_CACHE/pip-install.log" 2>&1 \
    || { tail -20 "$PEER_CACHE/pip-install.log" >&2; fail "pip install into $VENV"; }
  printf '%s' "$REQS" > "$VENV/.peer-reqs"
fi

# ---- the suites' copies ---------------------------------------------------------------------
if [[ " $SUITES " == *" libretranslate "* ]]; then
  SDIST=$PEER_CACHE/sdist
  mkdir -p "$SDIST"
  spec=libretranslate${LT_VERSION:+==$LT_VERSION}
  say "fetching the $spec source distribution"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "$spec" -d "$SDIST" >"$WORK/pip-download.log" 2>&1 || { cat "$WORK/pip-download.log" >&2; fail "pip download $spec"; }
  if [[ -n ${LT_VERSION:-} ]]; then
    tarball=$SDIST/libretranslate-$LT_VERSION.tar.gz
  else
    tarball=$(ls -1 "$SDIST"/libretranslate-*.tar.gz | sort -V | tail -1)
  fi
  [[ -f $tarball ]] || fail "no sdist at $tarball"
  top=$(basename "$tarball" .tar.gz)
  LT_DIR=$WORK/libretranslate
  rm -rf "$LT_DIR" && mkdir -p "$LT_DIR"
  tar -xzf "$tarball" -C "$LT_DIR" --strip-components=3 "$top/libretranslate/tests/test_api"
  [[ -f $LT_DIR/test_api/test_api_translate.py ]] || fail "$tarball has no libretranslate/tests/test_api"
  cp "$PEER/lt_conftest.py" "$LT_DIR/test_api/conftest.py"
  sed -i 's/"target": "es"/"target": "de"/g' "$LT_DIR/test_api/test_api_translate.py"
  printf '[pytest]\n' > "$LT_DIR/pytest.ini"
  say "libretranslate tests from $top (conftest.py replaced; target es -> de)"
fi
if [[ " $SUITES " == *" deepl-python "* ]]; then
  DL_DIR=$WORK/deepl-python
  rm -rf "$DL_DIR" && mkdir -p "$DL_DIR"
  cp -r "$PEER/deepl-tests/tests" "$DL_DIR/tests"
  printf '[pytest]\n' > "$DL_DIR/pytest.ini"
fi
# The pytest plugin that records each failing test's HTTP exchanges (it only observes).
mkdir -p "$WORK/plugins"
cp "$PEER/record_http.py" "$WORK/plugins/"

# ---- the service ----------------------------------------------------------------------------
SERVE_ENV=(MODEL_DIR="$REPO/models" DATA_DIR="$WORK/data")  # glossaries: gone with $WORK
if [[ -n ${PEER_SERVE_REV:-} ]]; then
  rev=$(git -C "$REPO" rev-parse --short "$PEER_SERVE_REV^{commit}") || fail "no revision $PEER_SERVE_REV"
  rm -rf "$WORK/serve-src" && mkdir -p "$WORK/serve-src"
  git -C "$REPO" archive "$rev" service | tar -x -C "$WORK/serve-src"
  # PYTHONPATH comes before the editable install's finder, so this copy of service/ is served.
  SERVE_ENV+=(PYTHONPATH="$WORK/serve-src")
  say "serving service/ as of $rev"
fi
free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server LABEL [VAR=VALUE...]: the service on a free loopback port, waited for until /ready.
start_server() {
  local label=$1; shift
  PORT=$(free_port)
  say "starting the service for $label on 127.0.0.1:$PORT ($*)"
  env "${SERVE_ENV[@]}" "$@" SHUTDOWN_DELAY_S=0 SHUTDOWN_GRACE_S=5 \
    "$SERVE" --host 127.0.0.1 --port "$PORT" --models en-de --threads "$THREADS" --workers 1 \
    >"$WORK/server-$label.log" 2>&1 &
  SERVER_PID=$!
  if ! "$PY" - "$PORT" "$READY_TIMEOUT_S" "$SERVER_PID" <<'EOF'
import os, sys, time, urllib.request
port, limit, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("the service exited")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(f"/ready not 200 within {limit:.0f} s")
EOF
  then
    tail -30 "$WORK/server-$label.log" >&2
    fail "the service did not become ready"
  fi
  say "ready"
}

# run_suite NAME DIR [VAR=VALUE...] -- PYTEST-ARGS...
SUMMARY=()
FAILED_ANY=0
SUMMARIES=()
run_suite() {
  local name=$1 dir=$2; shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  say "running $name"
  set +e
  # shellcheck disable=SC2086  # PEER_PYTEST_ARGS is a list of words
  (cd "$dir" && env "${envs[@]}" \
    HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
    http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 \
    NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost PYTHONDONTWRITEBYTECODE=1 \
    PYTHONPATH="$WORK/plugins" \
    timeout -k 10 "$SUITE_TIMEOUT_S" "$PY" -m pytest -c pytest.ini -p no:cacheprovider \
      -p record_http --timeout="$TEST_TIMEOUT_S" -q -rfE --tb=short \
      --junitxml="$WORK/$name.xml" ${PEER_PYTEST_ARGS:-} "$@") >"$WORK/$name.log" 2>&1
  local rc=$?
  set -e
  [[ $rc -eq 124 || $rc -eq 137 ]] && say "$name: suite timed out after ${SUITE_TIMEOUT_S}s"
  # The classes and their failures (summarize.py's last line is the summary line).
  "$PY" "$PEER/summarize.py" "$name" "$WORK/$name.xml" >"$WORK/$name.summary" || FAILED_ANY=1
  SUMMARIES+=("$WORK/$name.summary")
  SUMMARY+=("$(tail -n 1 "$WORK/$name.summary")")
  say "$name done (log: $WORK/$name.log, classes: $WORK/$name.summary)"
}

if [[ " $SUITES " == *" libretranslate "* ]]; then
  start_server libretranslate API_KEYS=
  run_suite libretranslate "$LT_DIR" PEER_LT_URL="http://127.0.0.1:$PORT/libretranslate" -- test_api
  stop_server
fi
if [[ " $SUITES " == *" deepl-python "* ]]; then
  start_server deepl-python API_KEYS=$DEEPL_KEY USAGE_LIMIT_CHARS=1000000
  run_suite deepl-python "$DL_DIR" -u DEEPL_MOCK_SERVER_PORT -u DEEPL_PROXY_URL \
    -u DEEPL_MOCK_PROXY_SERVER_PORT DEEPL_SERVER_URL="http://127.0.0.1:$PORT" \
    DEEPL_AUTH_KEY=$DEEPL_KEY -- tests
  stop_server
fi

echo
for file in "${SUMMARIES[@]}"; do sed '$d' "$file"; done
echo
for line in "${SUMMARY[@]}"; do echo "$line"; done
exit "$FAILED_ANY"
