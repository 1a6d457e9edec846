"""Many installed pairs served within a memory budget for a few (service.residency): requests
spread over the pairs at random by concurrent clients.

One bundle (``models/en-de`` by default) is served as ``--pairs`` pairs (xa-en, xb-en, ...:
links to its files, each with a manifest of its own, as ``bench/lazy_load.py`` makes them),
with ``MODEL_MEMORY_MB`` = ``--budget`` + 0.5 times the estimate a model counts until a quiet
load measures it (its graphs times ``ESTIMATE_FACTOR``). ``--clients`` clients each send one
sentence at a time to a pair drawn at random (seeded), in-process through ``Translator`` (no
HTTP), with the sentence cache off, for ``--seconds``. Prints throughput, latency
percentiles, loads and unloads per minute, the models resident, and resident memory; asserts
nothing.

    python bench/many_pairs.py [--pairs 12] [--budget 3] [--clients 8] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.lazy_load import pair_bundles
from bench.memory import rss_mib
from service.allocator import fix_mmap_threshold, numpy_hugepages
from service.bundle import load_bundle
from service.metrics import Metrics
from service.residency import ESTIMATE_FACTOR, graph_megabytes
from service.settings import Settings
from service.translator import TranslateOptions, Translator

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "The weather is nice today, so we are going for a walk in the park.",
    "Where is the nearest train station?",
    "I would like to book a room for two nights.",
    "The meeting has been moved to Thursday afternoon.",
    "Please send me the documents by email.",
    "Can you recommend a good restaurant near the hotel?",
]


def total(metrics: Metrics, name: str) -> float:
    return sum(sample.value for family in metrics.registry.collect() if family.name == name
               for sample in family.samples if sample.name == f"{name}_total")


async def run(translator: Translator, metrics: Metrics, pairs: list[tuple[str, str]],
              clients: int, seconds: float, seed: int) -> None:
    latencies: list[float] = []
    resident: list[float] = []
    counted: list[float] = []  # MiB the budget counts
    rss: list[float] = []
    stop = time.perf_counter() + seconds

    async def client(number: int) -> None:
        draw = random.Random(seed + number)
        while time.perf_counter() < stop:
            pair, sentence = draw.choice(pairs), draw.choice(SENTENCES)
            started = time.perf_counter()
            await translator.translate([sentence], pair, TranslateOptions())
            latencies.append(time.perf_counter() - started)

    async def sample() -> None:
        while time.perf_counter() < stop:
            resident.append(metrics.registry.get_sample_value("translate_models_resident") or 0)
            counted.append(metrics.registry.get_sample_value(
                "translate_models_resident_megabytes") or 0)
            rss.append(rss_mib()[0])
            await asyncio.sleep(0.5)

    started = time.perf_counter()
    await asyncio.gather(sample(), *(client(number) for number in range(clients)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    minutes = elapsed / 60
    print(f"{len(latencies)} requests in {elapsed:.1f} s: {len(latencies) / elapsed:.1f} "
          "requests/s (one sentence each)")
    print(f"latency p50 {statistics.median(latencies) * 1000:.0f} ms, p90 "
          f"{latencies[int(len(latencies) * 0.9)] * 1000:.0f} ms, p99 "
          f"{latencies[int(len(latencies) * 0.99)] * 1000:.0f} ms, max "
          f"{latencies[-1] * 1000:.0f} ms")
    loads, unloads = total(metrics, "translate_model_loads"), total(metrics,
                                                                    "translate_model_unloads")
    load_seconds = metrics.registry.get_sample_value("translate_model_load_seconds_sum") or 0
    print(f"loads {loads:.0f} ({loads / minutes:.1f}/min, {load_seconds / max(loads, 1):.2f} s "
          f"each on average), unloads {unloads:.0f} ({unloads / minutes:.1f}/min)")
    print(f"models resident (sampled every 0.5 s): mean {statistics.mean(resident):.1f}, max "
          f"{max(resident):.0f}; counted against the budget: mean {statistics.mean(counted):.0f}"
          f", max {max(counted):.0f} MiB")
    print(f"resident memory: {statistics.median(rss):.0f} MiB median, peak (VmHWM) "
          f"{rss_mib()[1]:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "en-de")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--budget", type=float, default=3, help="models that fit the budget")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    megabytes = graph_megabytes(load_bundle(args.model_dir), None)
    with tempfile.TemporaryDirectory() as tmp:
        pairs = pair_bundles(args.model_dir, Path(tmp), args.pairs)
        settings = Settings(model_dir=Path(tmp), device="cpu", threads=args.threads, workers=1,
                            cache_mb=0,
                            model_memory_mb=megabytes * ESTIMATE_FACTOR * (args.budget + 0.5))
        print(f"{len(pairs)} pairs of {args.model_dir.name} ({megabytes:.1f} MiB of graphs "
              f"each), MODEL_MEMORY_MB={settings.model_memory_mb:.0f} ({args.budget:g} + 0.5 "
              f"models at {ESTIMATE_FACTOR}x their graphs), {args.clients} clients, threads "
              f"{args.threads}, one worker; resident memory before: {rss_mib()[0]:.0f} "
              "MiB")
        fix_mmap_threshold(settings.malloc_mmap_threshold_kb)  # as the service sets them
        numpy_hugepages(settings.numpy_hugepages)
        metrics = Metrics()
        with Translator.load(settings, metrics=metrics) as translator:
            asyncio.run(run(translator, metrics, pairs, args.clients, args.seconds, args.seed))


if __name__ == "__main__":
    main()
