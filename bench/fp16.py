"""The fp16 variant against fp32 on one device: parity and decoding speed.

    python bench/fp16.py --bundle BUNDLE --test TEST.tsv [--sentences 200] [--device cpu|cuda]

BUNDLE needs both variants (``translate-train export ... --fp16``, or ``translate-train fp16
BUNDLE`` on an existing one). TEST.tsv's first column is translated (or a file of one sentence
a line). Printed:

* free-running greedy decoding of every sentence with each variant (``service.engine.Engine``
  on ``--device``; on CUDA with the caches in device memory): sentences whose tokens are
  identical, the share of fp32's tokens before the first difference, and the largest
  |Δ log-prob| of a sentence whose tokens agree;
* teacher forcing (``training.fp16.compare``, both graphs fed fp32's greedy tokens, until
  fp32's EOS): the largest |Δ log-prob| over each step's fp32 top-8 tokens and over the
  vocabulary, and the share of steps whose greedy choice agrees;
* milliseconds per sentence, wall clock and process CPU, for each variant at beam 1 and 4,
  batch 1 and 32 sentences (``--no-speed`` skips it).

A script that prints; it never asserts and is not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.placeholders import cpu_model, head_commit  # noqa: E402
from service.engine import Engine  # noqa: E402
from training.fp16 import compare  # noqa: E402

VARIANTS = ("fp32", "fp16")


def read_sources(path: Path, count: int) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0].strip() for line in lines if line.strip()][:count]


def free_running(engines: dict[str, Engine], sources: list[str]) -> None:
    results = {name: engine.translate(sources) for name, engine in engines.items()}
    identical, kept, total, worst = 0, 0, 0, 0.0
    for full, half in zip(results["fp32"], results["fp16"], strict=True):
        a, b = full.hypotheses[0], half.hypotheses[0]
        if a.token_ids == b.token_ids:
            identical += 1
            worst = max(worst, abs(a.log_prob - b.log_prob))
        pairs = zip(a.token_ids, b.token_ids, strict=False)
        common = next((i for i, (x, y) in enumerate(pairs) if x != y),
                      min(len(a.token_ids), len(b.token_ids)))
        kept += common
        total += len(a.token_ids)
    print(f"free-running greedy: {identical}/{len(sources)} sentences identical; "
          f"{kept / max(total, 1):.4f} of fp32's tokens before the first difference; "
          f"max |Δ sentence log-prob| where identical {worst:.4f}")


def teacher_forced(engine: Engine, sources: list[str], providers: list[str]) -> None:
    figures = {"max_abs_log_prob_top": 0.0, "max_abs_log_prob": 0.0}
    agree = steps = 0
    ids = [engine.tokenize(s) for s in sources]
    for start in range(0, len(ids), 16):
        chunk = ids[start : start + 16]
        batch = np.full((len(chunk), max(map(len, chunk))), engine.pad_id, np.int64)
        for row, tokens in enumerate(chunk):
            batch[row, : len(tokens)] = tokens
        limit = min(2 * batch.shape[1] + 10, engine.bundle.max_positions - 1)
        result = compare(engine.bundle.dir, batch, engine.bos_id, limit, engine.eos_id,
                         providers)
        for key in figures:
            figures[key] = max(figures[key], result[key])
        agree += round(result["greedy_agreement"] * result["steps"])
        steps += int(result["steps"])
    print(f"teacher-forced over {steps} steps: greedy agreement {agree / steps:.4f}; "
          f"max |Δ log-prob| of fp32's top-8 {figures['max_abs_log_prob_top']:.4f}, "
          f"of any token {figures['max_abs_log_prob']:.4f}")


def speed(engines: dict[str, Engine], sources: list[str]) -> None:
    for beam, batch in ((1, 1), (1, 32), (4, 1), (4, 32)):
        line = []
        for name, engine in engines.items():
            engine.translate(sources[:8], beam_size=beam, max_batch_rows=batch * beam)  # warm
            wall, cpu = time.perf_counter(), time.process_time()
            engine.translate(sources, beam_size=beam, max_batch_rows=batch * beam)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            line.append(f"{name} {1000 * wall / len(sources):.2f} ms wall "
                        f"{1000 * cpu / len(sources):.2f} ms cpu")
        print(f"beam {beam} batch {batch:>2}: " + " | ".join(line))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--test", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--no-speed", action="store_true")
    args = parser.parse_args()
    sources = read_sources(args.test, args.sentences)
    engines = {name: Engine(args.bundle, device=args.device, variant=name, threads=args.threads)
               for name in VARIANTS}
    engine = engines["fp32"]
    print(f"{args.bundle} on {args.device} ({engine.providers[0]}; {cpu_model()}, "
          f"{os.cpu_count()} CPUs; commit {head_commit()}), {len(sources)} sentences of "
          f"{args.test}; caches in device memory: {engines['fp16'].device_cache}")
    free_running(engines, sources)
    teacher_forced(engine, sources, engine.providers)
    if not args.no_speed:
        speed(engines, sources)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
