#!/usr/bin/env bash
# One branch of a recipe comparison: the shipped default model, recovered as a checkpoint
# (runs/en-de/shipped.pt, `translate-train recover`), trained on for MINUTES in one process of
# one thread at the main run's rate and batch (lr_scale 0.5, 2 x 2,000 target tokens a step),
# with whatever the extra arguments change. Run two side by side, one per core, and compare them
# at the same step with scripts/score-branch.sh (docs/en-de-baseline.md, "Recipe comparisons").
#   scripts/recipe-branch.sh NAME MINUTES [--config FILE] [--set section.field=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?NAME} minutes=${2:?MINUTES}; shift 2
[ -f runs/en-de/shipped.pt ] || .venv/bin/translate-train recover models/en-de runs/en-de/shipped.pt \
  --config configs/en-de.toml
exec nice .venv/bin/translate-train train --config configs/en-de.toml "$@" \
  --init-from runs/en-de/shipped.pt --set train.out_dir="runs/recipe/$name" \
  --set train.accumulate=2 --set train.lr_scale=0.5 --set train.checkpoint_every=250 \
  --set train.keep_last=40 --set train.validate_every=100000 --set train.max_minutes="$minutes"
