#!/usr/bin/env bash
# Creates the virtualenv LibreTranslate runs from in bench/libretranslate.py, outside the
# project's own environment (LibreTranslate pins Flask, numpy<2 and its own Argos fork, which
# must not meet the service's dependencies).
#
#   bench/libretranslate-venv.sh [VENV_DIR]      # default /work/lt-venv ($LT_VENV)
#
# torch goes in first and is pinned by a constraints file: argostranslate pulls in stanza,
# which asks for torch, and an unpinned resolve would fetch another multi-gigabyte wheel where
# the CPU wheel of 2.13.0 is already on disk. LibreTranslate's version is pinned so that the
# figures in docs/benchmarks.md can be reproduced.
set -euo pipefail
VENV="${1:-${LT_VENV:-/work/lt-venv}}"
LIBRETRANSLATE_VERSION="${LIBRETRANSLATE_VERSION:-1.9.6}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3.11}"

"$PYTHON" -m venv "$VENV"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$TORCH_VERSION" >"$constraints"
"$VENV/bin/pip" install -q --upgrade pip
# Set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu where no CPU wheel is at hand.
"$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
"$VENV/bin/pip" install -q -c "$constraints" "libretranslate==$LIBRETRANSLATE_VERSION" psutil
"$VENV/bin/pip" freeze >"$VENV/requirements.lock"
echo "LibreTranslate $LIBRETRANSLATE_VERSION in $VENV (pip freeze: $VENV/requirements.lock)"
