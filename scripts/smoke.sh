#!/usr/bin/env bash
# Container smoke test: lint, build the CPU image, start it with docker compose, wait until it
# is healthy (/ready), translate one sentence from the host, check that it runs as non-root on a
# read-only root filesystem, print the image size, and tear everything down.
#
#   bash scripts/smoke.sh          (or: make smoke)
#
# Needs a Docker engine. Without one, it starts the workplace sandbox engine
# (../shared/tools/docker-sandbox beside the repository) and stops it again at the end.
# Knobs (environment): SMOKE_TIMEOUT_S (180: seconds to wait for healthy), IMAGE_TAG (smoke),
# SMOKE_BUILD_CPUS (1: CPUs the image build may use), SMOKE_SKIP_LINT=1, SMOKE_NO_BUILD=1.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
SANDBOX=$REPO/../shared/tools/docker-sandbox
TIMEOUT_S=${SMOKE_TIMEOUT_S:-180}
BUILD_CPUS=${SMOKE_BUILD_CPUS:-1}
export IMAGE_TAG=${IMAGE_TAG:-smoke}
IMAGE=nmt-service:$IMAGE_TAG
PROJECT=nmt-smoke-$$
SERVICE=translator
STARTED_SANDBOX=0
T0=$SECONDS

say() { printf '[smoke %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { printf '[smoke %3ds] FAIL: %s\n' "$((SECONDS - T0))" "$*" >&2; exit 1; }

compose() { docker compose -p "$PROJECT" -f "$REPO/docker-compose.yml" "$@"; }

cleanup() {
  local rc=$?
  set +e
  if [[ -n ${COMPOSE_UP:-} ]]; then
    if [[ $rc -ne 0 ]]; then
      echo "---- last container logs ----" >&2
      compose logs --no-color --tail 60 "$SERVICE" >&2
      echo "-----------------------------" >&2
    fi
    say "tearing down ($PROJECT)"
    compose down -v --remove-orphans >/dev/null 2>&1
  fi
  if [[ $STARTED_SANDBOX == 1 ]]; then
    say "stopping the docker sandbox this script started"
    "$SANDBOX" down >/dev/null 2>&1
  fi
  if [[ $rc -eq 0 ]]; then say "PASS"; else say "smoke test failed (exit $rc)"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- a Docker engine ---------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  [[ -x $SANDBOX ]] || fail "no Docker engine (docker info fails) and no sandbox at $SANDBOX"
  # The sandbox may already be running for someone else: then use it and leave it running.
  eval "$("$SANDBOX" env)"
  if ! docker info >/dev/null 2>&1; then
    say "no Docker engine: starting the docker sandbox"
    eval "$("$SANDBOX" up)" || fail "the docker sandbox did not start"
    STARTED_SANDBOX=1
  else
    # Make sure the stand-in base images for our FROM lines exist (cheap when they do).
    eval "$("$SANDBOX" up 2>/dev/null)"
  fi
  docker info >/dev/null 2>&1 || fail "docker info still fails after starting the sandbox"
fi
docker compose version >/dev/null 2>&1 || fail "docker compose (v2 plugin) is not available"

# ---- lint ----------------------------------------------------------------------------------------
if [[ ${SMOKE_SKIP_LINT:-0} != 1 ]]; then
  say "lint (hadolint + compose config)"
  if [[ -x $SANDBOX ]]; then
    "$SANDBOX" lint || fail "lint reported problems (see above)"
  elif command -v hadolint >/dev/null; then
    hadolint Dockerfile Dockerfile.cuda || fail "hadolint reported problems"
    docker compose -f docker-compose.yml config -q || fail "docker compose config failed"
  else
    say "no hadolint here: only checking the compose file"
    docker compose -f docker-compose.yml config -q || fail "docker compose config failed"
  fi
fi

# ---- which bundle, which languages ----------------------------------------------------------------
if [[ -f models/en-de/manifest.json ]]; then
  MANIFEST_FILE=models/en-de/manifest.json
else
  MANIFEST_FILE=$(find models -mindepth 2 -maxdepth 2 -name manifest.json 2>/dev/null | sort | head -n 1)
  [[ -n $MANIFEST_FILE ]] || fail "no model bundle in models/ (expected models/en-de/manifest.json)"
  say "models/en-de is missing; using $(dirname "$MANIFEST_FILE") instead"
fi
read -r SRC TGT < <(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m["source_lang"], m["target_lang"])' "$MANIFEST_FILE")
[[ -n ${TGT:-} ]] || fail "could not read source_lang/target_lang from $MANIFEST_FILE"
say "bundle $(dirname "$MANIFEST_FILE"): $SRC -> $TGT"

# ---- build -----------------------------------------------------------------------------------------
if [[ ${SMOKE_NO_BUILD:-0} != 1 ]]; then
  say "building $IMAGE (Dockerfile, ${BUILD_CPUS} CPU)"
  t=$SECONDS
  nice -n 10 docker build --cpu-period 100000 --cpu-quota $((BUILD_CPUS * 100000)) \
    -t "$IMAGE" -f Dockerfile . >"${TMPDIR:-/tmp}/$PROJECT-build.log" 2>&1 \
    || { tail -n 40 "${TMPDIR:-/tmp}/$PROJECT-build.log" >&2; fail "docker build failed"; }
  say "built in $((SECONDS - t)) s"
  rm -f "${TMPDIR:-/tmp}/$PROJECT-build.log"
fi
SIZE_BYTES=$(docker image inspect -f '{{.Size}}' "$IMAGE") || fail "image $IMAGE not found"
say "image $IMAGE: $((SIZE_BYTES / 1000000)) MB"

# ---- start ------------------------------------------------------------------------------------------
PUBLISH_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PUBLISH_ADDR=127.0.0.1 PUBLISH_PORT API_KEYS="" LOG_JSON=false
say "starting compose project $PROJECT on 127.0.0.1:$PUBLISH_PORT"
COMPOSE_UP=1
compose up -d --no-build "$SERVICE" || fail "docker compose up failed"
CID=$(compose ps -q "$SERVICE")
[[ -n $CID ]] || fail "no container for $SERVICE"

t=$SECONDS
last=""
while :; do
  state=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}no-healthcheck{{end}}' "$CID")
  [[ $state != "$last" ]] && say "container: $state" && last=$state
  case $state in
    "running healthy") break ;;
    exited* | dead*) fail "the container stopped ($(docker inspect -f 'exit code {{.State.ExitCode}}' "$CID"))" ;;
    *no-healthcheck) fail "the image has no HEALTHCHECK" ;;
  esac
  ((SECONDS - t < TIMEOUT_S)) || fail "not healthy after ${TIMEOUT_S} s (state: $state)"
  if (((SECONDS - t) % 5 == 0)) && ((SECONDS > t)); then
    # /health turns 503 (load_failed) when loading the bundles failed: no point waiting then.
    if ! why=$(python3 - "$PUBLISH_PORT" <<'PY'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=3)
except urllib.error.HTTPError as exc:
    body = exc.read().decode(errors="replace")
    if "load_failed" in body:
        print(body[:400])
        sys.exit(1)
except OSError:
    pass  # not listening yet
PY
    ); then
      fail "the service could not load its models: $why"
    fi
    (((SECONDS - t) % 15 == 0)) && say "still waiting ($((SECONDS - t)) s)"
  fi
  sleep 1
done
HEALTHY_S=$((SECONDS - t))
say "healthy after ${HEALTHY_S} s"

mapped=$(compose port "$SERVICE" 8000 | tail -n 1)
[[ ${mapped##*:} == "$PUBLISH_PORT" ]] || fail "port 8000 is published as '$mapped', expected $PUBLISH_PORT"

# ---- translate from the host ---------------------------------------------------------------------------
SENTENCE="The weather is nice today, so we are going for a walk in the park."
python3 - "$PUBLISH_PORT" "$SRC" "$TGT" "$SENTENCE" <<'PY' || fail "translation check failed"
import json, sys, time, urllib.error, urllib.request

port, src, tgt, sentence = sys.argv[1:]
base = f"http://127.0.0.1:{port}"
for path in ("/health", "/ready", "/", "/page/page.js"):  # the page's files are in the image
    with urllib.request.urlopen(base + path, timeout=10) as response:
        assert response.status == 200, (path, response.status)
body = json.dumps({"text": sentence, "source_lang": src, "target_lang": tgt}).encode()
request = urllib.request.Request(
    base + "/translate", data=body, headers={"Content-Type": "application/json"}, method="POST"
)
start = time.perf_counter()
try:
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = json.load(response)
except urllib.error.HTTPError as exc:
    sys.exit(f"POST /translate -> HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}")
elapsed_ms = (time.perf_counter() - start) * 1000
print(f"[smoke] {src}: {sentence}")
translations = payload.get("translations") or []
if len(translations) != 1:
    sys.exit(f"expected 1 translation, got {payload!r}")
text = (translations[0].get("text") or "").strip()
print(f"[smoke] {tgt}: {text}   ({elapsed_ms:.0f} ms)")
if not text:
    sys.exit("the translation is empty")
if text == sentence.strip():
    sys.exit("the translation is the input unchanged")
if payload.get("target_lang") != tgt:
    sys.exit(f"target_lang {payload.get('target_lang')!r}, expected {tgt!r}")
PY

# ---- hardening: non-root, read-only root filesystem ---------------------------------------------------
uid=$(compose exec -T "$SERVICE" id -u | tr -d '\r')
[[ $uid =~ ^[0-9]+$ ]] || fail "could not read the container's uid ('$uid')"
[[ $uid != 0 ]] || fail "the service runs as root"
say "container process uid: $uid (non-root)"
if compose exec -T "$SERVICE" sh -c 'touch /opt/models/.w' >/dev/null 2>&1; then
  fail "the root filesystem is writable"
fi
compose exec -T "$SERVICE" sh -c 'touch /tmp/.w && rm /tmp/.w' || fail "/tmp (tmpfs) is not writable"
say "root filesystem read-only, /tmp writable"

say "summary: image $((SIZE_BYTES / 1000000)) MB, healthy after ${HEALTHY_S} s, total $((SECONDS - T0)) s"
