#!/usr/bin/env bash
# Train the default English→German model in the background, time-boxed:
#   MINUTES=95 PROCS=2 scripts/train-default.sh    # logs to stdout; run it under nohup
# It resumes runs/en-de/train when a run is there. Otherwise it continues the shipped model
# (models/en-de, its weights recovered from the bundle, its vocabulary reused), or with FRESH=1
# starts from scratch. Extra arguments go to `translate-train train`.
# On a CPU machine, PROCS processes of one thread each (DDP over gloo) beat one process with
# PROCS threads; on GPUs PROCS is the number of GPUs (NCCL).
set -euo pipefail
cd "$(dirname "$0")/.."
config=configs/en-de.toml
cli=.venv/bin/translate-train
[ -f runs/en-de/data/train.tsv ] || "$cli" prepare --config "$config"
if [ -f runs/en-de/train/checkpoint_last.pt ]; then
  start=(--resume)
elif [ -z "${FRESH:-}" ] && [ -f models/en-de/manifest.json ]; then
  # The weights' rows are the shipped vocabulary's ids: train with that vocabulary.
  mkdir -p runs/en-de/vocab
  cp models/en-de/sentencepiece.model runs/en-de/vocab/spm.model
  "$cli" recover models/en-de runs/en-de/shipped.pt
  start=(--init-from runs/en-de/shipped.pt)
else
  [ -f runs/en-de/vocab/spm.model ] || "$cli" vocab --config "$config"
  start=()
fi
exec nice .venv/bin/torchrun --standalone --nproc_per_node "${PROCS:-2}" -m training.cli train \
  --config "$config" "${start[@]}" --set train.max_minutes="${MINUTES:-95}" "$@"
