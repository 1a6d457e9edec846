"""Pairs loaded on their first request (service.residency): the cold first request's latency
against a loaded pair's, and a loaded pair's latency while another pair loads.

One bundle (``models/en-de`` by default) is served as ``--pairs`` pairs (xa-en, xb-en, ...:
links to its files, each with a manifest of its own), with a budget of ``--budget`` models,
in-process through ``Translator``. Prints figures; asserts nothing.

    python bench/lazy_load.py [--model-dir models/en-de] [--pairs 3] [--budget 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from service.bundle import MANIFEST, load_bundle
from service.residency import ESTIMATE_FACTOR, graph_megabytes
from service.settings import Settings
from service.translator import TranslateOptions, Translator

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "The weather is nice today, so we are going for a walk in the park."


def pair_bundles(bundle: Path, root: Path, count: int) -> list[tuple[str, str]]:
    """``count`` bundles under ``root``, each the files of ``bundle`` (linked) as another
    source language into English."""
    pairs = []
    for index in range(count):
        source = f"x{chr(ord('a') + index)}"
        target = root / f"{source}-en"
        target.mkdir(parents=True)
        for file in bundle.iterdir():
            if file.name != MANIFEST:
                (target / file.name).symlink_to(file.resolve())
        manifest = json.loads((bundle / MANIFEST).read_text())
        manifest.update(source_lang=source, target_lang="en")
        (target / MANIFEST).write_text(json.dumps(manifest))
        pairs.append((source, "en"))
    return pairs


async def timed(translator: Translator, pair: tuple[str, str]) -> float:
    started = time.perf_counter()
    await translator.translate([SENTENCE], pair, TranslateOptions())
    return time.perf_counter() - started


async def measure(translator: Translator, pairs: list[tuple[str, str]]) -> None:
    first, second = pairs[0], pairs[1]
    cold = [await timed(translator, pair) for pair in pairs]
    warm = [await timed(translator, pairs[-1]) for _ in range(10)]
    print("cold first request per pair (load + translate): "
          + ", ".join(f"{seconds * 1000:.0f} ms" for seconds in cold))
    print(f"loaded pair, one sentence: p50 {statistics.median(warm) * 1000:.1f} ms over 10")
    # ``first`` was evicted when the budget is smaller than the pairs: it loads again here
    # while ``last`` keeps answering.
    last = pairs[-1]
    loading = asyncio.create_task(timed(translator, first if first != last else second))
    during = []
    while not loading.done():
        during.append(await timed(translator, last))
    reload_s = await loading
    during.sort()
    p99 = during[min(len(during) - 1, int(len(during) * 0.99))]
    print(f"while another pair loaded ({reload_s * 1000:.0f} ms): loaded pair p50 "
          f"{statistics.median(during) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms over "
          f"{len(during)} requests")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "en-de")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--budget", type=int, default=1, help="models that fit the budget")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    bundle = load_bundle(args.model_dir)
    megabytes = graph_megabytes(bundle, None)
    with tempfile.TemporaryDirectory() as tmp:
        pairs = pair_bundles(args.model_dir, Path(tmp), max(2, args.pairs))
        settings = Settings(model_dir=Path(tmp), device="cpu", threads=args.threads, workers=1,
                            cache_mb=0,
                            model_memory_mb=megabytes * ESTIMATE_FACTOR * (args.budget + 0.5))
        print(f"{len(pairs)} pairs of {args.model_dir.name} ({megabytes:.0f} MB of graphs "
              f"each), MODEL_MEMORY_MB={settings.model_memory_mb:.0f}, threads {args.threads}")
        with Translator.load(settings) as translator:
            asyncio.run(measure(translator, pairs))


if __name__ == "__main__":
    main()
