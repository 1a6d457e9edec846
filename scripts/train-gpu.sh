#!/usr/bin/env bash
# Train the English→German model on one CUDA GPU in a time box (configs/en-de-gpu.toml: the
# base width with 6 encoder and 2 decoder layers, bf16 autocast, ~32k-token batches, 7.5 minutes,
# a checkpoint every 250 steps, the last five averaged), from data prepared on this machine, and
# bring the averaged weights back. Three steps, each a subcommand; several run in order:
#
#   here:        scripts/train-gpu.sh carry        (last before the GPU call: it clears gpu/)
#       gpu/ (git-ignored): data/train.tsv.xz (runs/en-de/data/train.tsv, xz: ~10 MB instead of
#       51), data/dev.tsv and vocab/spm.model; it prints the size, which must leave the rest
#       of the checkout under the 64 MiB a device call carries.
#   GPU machine: the device tool's run, e.g. command "scripts/train-gpu.sh train",
#       carry ["gpu"], timeout_s 600. It trains into gpu/train (checkpoints stay there) and
#       writes $OUT/result: the averaged checkpoint's weights as fp16 shards of < 16 MiB
#       (training/shards.py), weights.json, metrics.jsonl and train.log, 7 files of at most 8
#       that come back. MINUTES=6 shortens the box; arguments after -- go to `train`
#       (e.g. scripts/train-gpu.sh train -- --set train.lr_scale=1.0).
#   here:        FETCH_FROM=DIR scripts/train-gpu.sh fetch
#       DIR: where $OUT/result came back (the tool's files_at + /result). Writes
#       runs/en-de-gpu/checkpoint_avg.pt, an fp32 checkpoint naming runs/en-de/vocab/spm.model
#       and runs/en-de/data, for `translate-train export` and `train --init-from`.
#
# Before the GPU call: the checkout travels whole, and the tracked models/en-de alone is 78 MB,
# over the 64 MiB limit: keep the bundle out of the working tree for that call.
#
# TINY=1 scripts/train-gpu.sh carry train fetch: the same path on a CPU in a few minutes, with
# the tiny preset (6+2 layers of width 64), 2,000-token batches, 20 steps, a checkpoint every
# 5 (tests/test_train_gpu.py runs it on the test fixture). Env overrides: CONFIG, CARRY (gpu),
# DATA_DIR (runs/en-de/data), VOCAB (runs/en-de/vocab/spm.model), OUT (result's parent;
# default: $CARRY), FETCH_TO (runs/en-de-gpu/checkpoint_avg.pt), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/en-de-gpu.toml}
CARRY=${CARRY:-gpu}
DATA_DIR=${DATA_DIR:-runs/en-de/data}
VOCAB=${VOCAB:-runs/en-de/vocab/spm.model}
RESULT=${OUT:-$CARRY}/result
FETCH_TO=${FETCH_TO:-runs/en-de-gpu/checkpoint_avg.pt}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
cli=("$PYTHON" -m training.cli)

carry() {
  [ -f "$DATA_DIR/train.tsv" ] || { echo "no $DATA_DIR/train.tsv: run translate-train prepare" >&2; exit 1; }
  [ -f "$VOCAB" ] || { echo "no $VOCAB: run translate-train vocab" >&2; exit 1; }
  rm -rf "$CARRY/data" "$CARRY/vocab" "$CARRY/train" "$CARRY/result"
  mkdir -p "$CARRY/data" "$CARRY/vocab"
  xz -T0 -6 -c "$DATA_DIR/train.tsv" > "$CARRY/data/train.tsv.xz"
  cp "$DATA_DIR/dev.tsv" "$CARRY/data/dev.tsv"
  cp "$VOCAB" "$CARRY/vocab/spm.model"
  du -b "$CARRY/data/train.tsv.xz" "$CARRY/data/dev.tsv" "$CARRY/vocab/spm.model"
  du -sh "$CARRY"
}

train() {
  local tiny=()
  if [ -n "${TINY:-}" ]; then
    tiny=(--set model.preset=tiny --set train.batch_tokens=2000 --set train.max_steps=20
          --set train.warmup_steps=10 --set train.checkpoint_every=5 --set train.validate_every=10
          --set train.dev_bleu_sentences=8 --set train.log_every=5)
  fi
  [ -z "${MINUTES:-}" ] || tiny+=(--set "train.max_minutes=$MINUTES")
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv
  rm -rf "$CARRY/train" "$RESULT"
  mkdir -p "$RESULT"
  PYTHONUNBUFFERED=1 "${cli[@]}" train --config "$CONFIG" \
    --set "data.out_dir=$CARRY/data" --set "vocab.model_prefix=$CARRY/vocab/spm" \
    --set "train.out_dir=$CARRY/train" "${tiny[@]}" "$@" 2>&1 | tee "$RESULT/train.log"
  local best="$CARRY/train/checkpoint_avg.pt"
  [ -f "$best" ] || best="$CARRY/train/checkpoint_last.pt"
  "${cli[@]}" pack "$best" "$RESULT"
  cp "$CARRY/train/metrics.jsonl" "$RESULT/"
  # The token cache (66 MB for the tiny preset's 128 positions) and the checkpoints must not
  # travel with the next call; checkpoints a GPU run leaves there go back with its machine.
  rm -rf "$CARRY/data/cache"
  ls -l "$RESULT"
}

fetch() {
  local from=$1
  "${cli[@]}" unpack "$from" "$FETCH_TO" --vocab "$VOCAB" --data-dir "$DATA_DIR"
}

[ $# -gt 0 ] || { sed -n '2,30p' "$0"; exit 2; }
steps=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do steps+=("$1"); shift; done
[ $# -eq 0 ] || shift  # what follows -- goes to `translate-train train`
for step in "${steps[@]}"; do
  case $step in
    carry) carry ;;
    train) train "$@" ;;
    fetch) fetch "${FETCH_FROM:-$RESULT}" ;;
    *) echo "unknown step $step: carry, train or fetch" >&2; exit 2 ;;
  esac
done
