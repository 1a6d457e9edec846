#!/usr/bin/env bash
# Score a recipe branch (scripts/recipe-branch.sh) at STEP: the average of its checkpoints
# STEP-1000 ... STEP (every 250), exported as the default model is (int8, length penalty 1.6),
# decoded on dev at beam 2 by source and domain; the translations go to runs/recipe/NAME-STEP.hyp
# for a paired comparison (sacrebleu REF -i A.hyp B.hyp --paired-bs).
#   scripts/score-branch.sh NAME STEP [CONFIG (configs/en-de.toml)]; THREADS=N
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?NAME} step=${2:?STEP} config=${3:-configs/en-de.toml} threads=${THREADS:-2}
run=runs/recipe/$name out=runs/recipe/$name-$step
ckpts=()
for s in $((step - 1000)) $((step - 750)) $((step - 500)) $((step - 250)) "$step"; do
  ckpts+=("$run/checkpoint_$s.pt")
done
.venv/bin/translate-train average "$out.pt" "${ckpts[@]}" --config "$config" > "$out.log" 2>&1
rm -rf "$out"
.venv/bin/translate-train export "$out.pt" "$out" --config "$config" --int8 --default-variant int8 \
  --decoding length_penalty=1.6 --calibration runs/en-de/data/train.tsv >> "$out.log" 2>&1
.venv/bin/translate-train evaluate "$out" runs/en-de/data/dev.tsv --config "$config" --by-source \
  --beam-size 2 --threads "$threads" --hypotheses "$out.hyp" > "$out.json" 2>> "$out.log"
python3 -c "
import json; r = json.load(open('$out.json'))
print('$name @ $step dev', round(r['bleu'], 2), round(r['chrf'], 2))
print({d: (round(v['bleu'], 2), round(v['chrf'], 2)) for d, v in r.get('by_domain', {}).items()})"
