#!/usr/bin/env bash
# Train (or resume) the default English→German model in the background, time-boxed.
#   MINUTES=95 PROCS=2 scripts/train-default.sh    # logs to stdout; run it under nohup
# On a CPU machine, PROCS processes of one thread each (DDP over gloo) beat one process with
# PROCS threads; on GPUs PROCS is the number of GPUs (NCCL).
set -euo pipefail
cd "$(dirname "$0")/.."
resume=()
[ -f runs/en-de/train/checkpoint_last.pt ] && resume=(--resume)
exec nice .venv/bin/torchrun --standalone --nproc_per_node "${PROCS:-2}" -m training.cli train \
  --config configs/en-de.toml "${resume[@]}" --set train.max_minutes="${MINUTES:-95}" "$@"
