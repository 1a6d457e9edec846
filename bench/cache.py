"""The sentence cache's cost: a get (hit and miss) and a put per call, and memory per entry,
by the cache's own accounting and by tracemalloc.

Entries are shaped as the service's are: the source side of a parallel TSV tokenised with a
bundle's SentencePiece model as the key, the target side as the translation (its text, ids
and pieces), ``--hypotheses`` of them per sentence.

    python bench/cache.py runs/en-de/data/test.tsv --bundle models/en-de
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from pathlib import Path

import sentencepiece as spm

from service.bundle import load_bundle
from service.search import DecodeOptions, Hypothesis, Translation
from service.sentence_cache import (
    ENTRY_OVERHEAD,
    SentenceCache,
    _freeze,
    entry_bytes,
    model_fingerprint,
    sentence_key,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tsv", type=Path, help="source<TAB>target lines")
    parser.add_argument("--bundle", type=Path, default=Path("models/en-de"))
    parser.add_argument("--hypotheses", type=int, default=1, help="alternatives per sentence")
    parser.add_argument("--entries", type=int, default=100_000, help="entries for the memory")
    args = parser.parse_args()

    bundle = load_bundle(args.bundle, verify_checksums=False)
    model = model_fingerprint(bundle.manifest, bundle.manifest["default_variant"])
    tokenizer = spm.SentencePieceProcessor(model_file=str(bundle.tokenizer_path))
    pairs = [line.split("\t")[:2]
             for line in args.tsv.read_text(encoding="utf-8").splitlines() if "\t" in line]
    options = DecodeOptions(beam_size=max(2, args.hypotheses), num_hypotheses=args.hypotheses)
    pair = (bundle.source_lang, bundle.target_lang)

    def entry(index: int) -> tuple[tuple, Translation]:
        source, target = pairs[index % len(pairs)]
        # A distinct source per entry, as many distinct sentences are: the index as a token.
        ids = [*tokenizer.encode(source), index]
        target_ids = tokenizer.encode(target)
        score = -0.5 - index * 1e-9  # a float object per entry, as real scores are
        hypotheses = [
            Hypothesis(tokenizer.decode(target_ids), list(target_ids),
                       [tokenizer.id_to_piece(i) for i in target_ids], score, score * 20,
                       len(target_ids) + 1)
            for _ in range(args.hypotheses)
        ]
        return sentence_key(model, pair, options, ids), Translation(hypotheses)

    # Memory: tracemalloc's growth while the cache fills against its own count.
    gc.collect()
    tracemalloc.start()
    cache = SentenceCache(1 << 40)
    before = tracemalloc.get_traced_memory()[0]
    payload = 0
    for index in range(args.entries):
        key, translation = entry(index)
        cache.put(key, translation)
        payload += entry_bytes(key, _freeze(translation)) - ENTRY_OVERHEAD
        del key, translation
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    entries = len(cache)
    print(f"{entries} entries, {args.hypotheses} hypothesis(es) each: accounted "
          f"{cache.bytes / entries:.0f} B an entry, tracemalloc {traced / entries:.0f} B "
          f"(ratio {cache.bytes / traced:.3f}); keys and values alone "
          f"{payload / entries:.0f} B, so the LRU's bookkeeping is "
          f"{(traced - payload) / entries:.0f} B an entry (ENTRY_OVERHEAD = {ENTRY_OVERHEAD})")

    # Cost per call, on a cache of 10,000 entries.
    cache = SentenceCache(1 << 40)
    items = [entry(index) for index in range(10_000)]
    missing = [entry(index + 10_000)[0] for index in range(10_000)]

    def per_call(call, keys) -> float:
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for key in keys:
                call(key)
            runs.append((time.perf_counter() - started) / len(keys))
        return statistics.median(runs) * 1e6

    started = time.perf_counter()
    for key, translation in items:
        cache.put(key, translation)
    put_us = (time.perf_counter() - started) / len(items) * 1e6
    hit_us = per_call(cache.get, [key for key, _ in items])
    miss_us = per_call(cache.get, missing)
    source = pairs[0][0]
    key_us = per_call(lambda _: sentence_key(model, pair, options, tokenizer.encode(source)),
                      range(10_000))
    print(f"per call: put {put_us:.1f} us, get hit {hit_us:.1f} us, get miss {miss_us:.1f} us, "
          f"key with tokenisation {key_us:.1f} us")


if __name__ == "__main__":
    main()
