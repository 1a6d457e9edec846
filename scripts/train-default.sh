#!/usr/bin/env bash
# Train (or resume) the default English→German model in the background, time-boxed.
#   MINUTES=95 scripts/train-default.sh        # logs to runs/en-de/train.log
set -euo pipefail
cd "$(dirname "$0")/.."
resume=()
[ -f runs/en-de/train/checkpoint_last.pt ] && resume=(--resume)
exec nice .venv/bin/translate-train train --config configs/en-de.toml "${resume[@]}" \
  --set train.max_minutes="${MINUTES:-95}" "$@"
