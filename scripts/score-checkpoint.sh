#!/usr/bin/env bash
# Export a checkpoint of the default model's training run (int8 default) and score it on dev
# and test by source and domain, beam 2. The decoding is the previous default model's (no
# repeated 3-gram, length penalty 1.6), so checkpoints compare with its figures in
# docs/en-de-baseline.md.
#   scripts/score-checkpoint.sh [CKPT (runs/en-de/train/checkpoint_avg.pt)] [OUT (runs/en-de/eval-bundle)]; THREADS=N
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt=${1:-runs/en-de/train/checkpoint_avg.pt}; out=${2:-runs/en-de/eval-bundle}; threads=${THREADS:-2}
rm -rf "$out"
.venv/bin/translate-train export "$ckpt" "$out" --config configs/en-de.toml --int8 --default-variant int8 \
  --decoding no_repeat_ngram_size=3 --decoding length_penalty=1.6 \
  --calibration runs/en-de/data/train.tsv > "$out.export.log" 2>&1
for split in dev test; do
  .venv/bin/translate-train evaluate "$out" runs/en-de/data/$split.tsv --config configs/en-de.toml \
    --by-source --beam-size 2 --threads "$threads" > "$out.$split.json" 2> "$out.$split.err"
  python3 -c "import json; r=json.load(open('$out.$split.json')); print('$split', {k: r[k] for k in ('bleu','chrf','sentences','seconds') if k in r}); print({d: (round(v['bleu'],2), round(v['chrf'],2)) for d, v in r.get('by_domain', {}).items()}); print('verbatim', r.get('verbatim', {}).get('overall', r.get('verbatim')))"
done
.venv/bin/python scripts/everyday.py models/en-de "$out" > "$out.everyday.md" 2>/dev/null || true
cat "$out.everyday.md"
