"""Source-language detection on both sides of a parallel TSV: accuracy over all lines and over
short ones (UI strings), latency per call, resident memory the model adds.

    python bench/detect.py runs/en-de/data/test.tsv --languages en,de,fr,es,it,nl,pt,pl,sv,da
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy  # noqa: F401  (the service has it loaded already: not the detector's memory)


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tsv", type=Path, help="source<TAB>target lines")
    parser.add_argument("--sides", default="en,de", help="languages of the two columns")
    parser.add_argument("--languages", default="en,de", help="languages to choose among")
    parser.add_argument("--short", type=int, default=30, help="short: at most this many chars")
    args = parser.parse_args()

    before = resident_mib()
    from service.detect import LanguageDetector

    detector = LanguageDetector(args.languages.split(","))
    added = resident_mib() - before
    sides = args.sides.split(",")
    samples = [(column, sides[side])
               for line in args.tsv.read_text(encoding="utf-8").splitlines()
               for side, column in enumerate(line.split("\t")[:2])]
    right = right_short = short = 0
    latencies = []
    for text, language in samples:
        started = time.perf_counter()
        answers = detector.detect(text)
        latencies.append(time.perf_counter() - started)
        hit = bool(answers) and answers[0][0] == language
        right += hit
        if len(text) <= args.short:
            short += 1
            right_short += hit
    print(f"languages {args.languages}: accuracy {right / len(samples):.3f} over {len(samples)} "
          f"texts, {right_short / max(short, 1):.3f} over the {short} of <= {args.short} chars; "
          f"latency median {statistics.median(latencies) * 1e3:.3f} ms, "
          f"mean {statistics.fmean(latencies) * 1e3:.3f} ms; model +{added:.0f} MiB resident")


if __name__ == "__main__":
    main()
