#!/usr/bin/env bash
# Train the default English→German model in the background, time-boxed:
#   MINUTES=95 PROCS=2 scripts/train-default.sh    # logs to stdout; run it under nohup
# It resumes runs/en-de/train when a run is there, and otherwise starts one from scratch with
# the grown corpus's vocabulary (runs/en-de/vocab, trained first if missing). It does not
# continue the model shipped until the corpus grew: that model was trained on a Bible pairing
# whose English side was a copyrighted modernisation, and its vocabulary is not this one.
# Extra arguments go to `translate-train train`; CONFIG picks another config (weights from
# scripts/train-gpu.sh continue with --init-from under a config of their shape).
# On a CPU machine, PROCS processes of one thread each (DDP over gloo) beat one process with
# PROCS threads; on GPUs PROCS is the number of GPUs (NCCL).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${CONFIG:-configs/en-de.toml}
cli=.venv/bin/translate-train
[ -f runs/en-de/data/train.tsv ] || "$cli" prepare --config "$config"
[ -f runs/en-de/vocab/spm.model ] || "$cli" vocab --config "$config"
start=()
[ -f runs/en-de/train/checkpoint_last.pt ] && start=(--resume)
exec nice .venv/bin/torchrun --standalone --nproc_per_node "${PROCS:-2}" -m training.cli train \
  --config "$config" "${start[@]}" --set train.max_minutes="${MINUTES:-95}" "$@"
