#!/usr/bin/env bash
# The GPU checks of the CUDA path in one run (about 5 minutes on one GPU), printing figures:
#
#   scripts/gpu-check.sh [BUNDLE] [TEST]
#
# BUNDLE (default models/en-de) gets the fp16 variant in a temporary copy when it has none.
# TEST is a TSV (source first) or one sentence a line (default runs/en-de/data/test.tsv when
# it exists, else tests/fixtures/overfit.tsv); 200 sentences of it are decoded.
#
# 1. which providers onnxruntime has, and whether CUDA runs;
# 2. where onnxruntime places the decoder's nodes on CUDA, fp16 and fp32 (the fp16 decoder
#    should have none on the CPU provider but shape arithmetic);
# 3. bench/fp16.py on CUDA: fp16 against fp32 (greedy agreement, log-prob differences) and ms
#    per sentence of each, with the caches in device memory;
# 4. the engine tests on CUDA (tests/test_fp16.py; its CUDA test decodes the tiny model's
#    fixture on the GPU with greedy and beam search and continuous batching), when pytest and
#    torch are there.
#
# Needs a Python (PYTHON, default python3) with onnxruntime-gpu, numpy, sentencepiece and onnx
# (the image of Dockerfile.cuda has them: docker run --gpus all -v "$PWD:/src" -w /src
# --entrypoint bash nmt-service:cuda scripts/gpu-check.sh /opt/models/en-de); step 4 also
# pytest and torch. Without a CUDA device every CUDA part is skipped, said so, and steps 3
# and 4 run on the CPU instead, as far as they go.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUNDLE=${1:-models/en-de}
TEST=${2:-runs/en-de/data/test.tsv}
[[ -f $TEST ]] || TEST=tests/fixtures/overfit.tsv
SENTENCES=${SENTENCES:-200}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
failed=0

section() { printf '\n== %s\n' "$*"; }

section "1. providers"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PYTHON" - <<'EOF' || { echo "no usable onnxruntime in $PYTHON"; exit 1; }
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.get_available_providers())
EOF
DEVICE=$("$PYTHON" - <<'EOF' 2>/dev/null
from service.device_cache import cuda_runs
print("cuda" if cuda_runs() else "cpu")
EOF
)
DEVICE=${DEVICE:-cpu}
if [[ $DEVICE == cuda ]]; then echo "CUDA runs"; else echo "SKIP CUDA: no CUDA device usable by onnxruntime; what follows runs on the CPU"; fi

section "bundle"
if ! "$PYTHON" -c "import json, sys; sys.exit('fp16' not in json.load(open(sys.argv[1]))['variants'])" "$BUNDLE/manifest.json"; then
    cp -r "$BUNDLE" "$SCRATCH/bundle" && BUNDLE=$SCRATCH/bundle
    "$PYTHON" -m training.cli fp16 "$BUNDLE" >/dev/null || { echo "fp16 conversion failed"; exit 1; }
fi
echo "$BUNDLE"

section "2. node placement on $DEVICE"
if [[ $DEVICE == cuda ]]; then
    for graph in decoder.fp16.onnx decoder.onnx encoder.fp16.onnx; do
        echo "-- $graph"
        timeout 120 "$PYTHON" - "$BUNDLE/$graph" 2>&1 <<'EOF' | grep VerifyEachNodeIsAssignedToAnEp | sed 's/.*VerifyEachNodeIsAssignedToAnEp\]//' | head -60
import sys
import onnxruntime as ort
options = ort.SessionOptions()
options.log_severity_level = 0  # verbose: onnxruntime lists the nodes placed on each provider
ort.InferenceSession(sys.argv[1], options,
                     providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
EOF
    done
else
    echo "SKIP: CUDA only"
fi

section "3. bench/fp16.py on $DEVICE"
if [[ $DEVICE == cuda ]]; then
    timeout 420 "$PYTHON" bench/fp16.py --bundle "$BUNDLE" --test "$TEST" --sentences "$SENTENCES" --device cuda || failed=1
else  # the CPU's figures are docs/benchmarks.md's; parity only, on fewer sentences
    timeout 300 "$PYTHON" bench/fp16.py --bundle "$BUNDLE" --test "$TEST" --sentences 16 --device cpu --no-speed || failed=1
fi

section "4. engine tests"
if "$PYTHON" -c "import pytest, torch" 2>/dev/null; then
    timeout 300 "$PYTHON" -m pytest tests/test_fp16.py -q -rs -p no:cacheprovider || failed=1
else
    echo "SKIP: needs pytest and torch (the dev and train extras)"
fi
exit $failed
