"""Fair admission: what a one-sentence request sees while the largest allowed request decodes.

Three phases against one server: (1) one-sentence requests one after another on an idle
server (their latency alone); (2) the largest request the limits allow (MAX_REQUEST_SENTENCES
sentences in MAX_TEXTS texts, each sentence several test sentences joined by commas, so each
is long) while a probe client keeps sending one-sentence requests, one at a time, until it
finishes; (3) the same large request plus one sentence more, which must be refused (413)
before any work. Reported: status counts, the probes' latency alone and beside the large
request, and a batch's sentence time during phase 2 (per-worker decoder step time times the
mean tokens a finished sentence generated, both from the server's /metrics), which is what a
newcomer's latency should be of the order of. It prints figures and never asserts.

    python bench/fairness.py                             # starts a server from MODEL_DIR
    python bench/fairness.py --url http://localhost:8000 --max-sentences 512 --texts 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import DEFAULT_TESTS, ROOT, Server, read_sentences

_SAMPLE = re.compile(r"^(translate_[a-z_]+)(\{[^}]*\})? (\S+)$", re.MULTILINE)


async def scrape(client: aiohttp.ClientSession) -> dict[str, float]:
    """Counters summed over their labels, plus ``..._done`` for finished sentences."""
    async with client.get("/metrics") as response:
        text = await response.text()
    totals: Counter[str] = Counter()
    for name, labels, value in _SAMPLE.findall(text):
        totals[name] += float(value)
        if name == "translate_sentences_total" and 'outcome="done"' in (labels or ""):
            totals["done"] += float(value)
    return totals


def long_sentences(sentences: list[str], count: int, per: int, seed: int = 0) -> list[str]:
    """``count`` single sentences, each ``per`` test sentences joined by commas."""
    pool = random.Random(seed)
    stems = [s.rstrip(".!?…").strip() for s in sentences if s.strip()]
    return [", ".join(pool.choice(stems) for _ in range(per)) + "." for _ in range(count)]


def as_texts(sentences: list[str], texts: int) -> list[str]:
    per_text = -(-len(sentences) // texts)
    return [" ".join(sentences[i : i + per_text]) for i in range(0, len(sentences), per_text)]


async def probe(client: aiohttp.ClientSession, text: str) -> tuple[int, float]:
    started = time.perf_counter()
    async with client.post("/translate", json={"text": text}) as response:
        await response.read()
        return response.status, time.perf_counter() - started


def summary(latencies: list[float]) -> str:
    if not latencies:
        return "none"
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (f"n={len(ordered)} p50 {1000 * statistics.median(ordered):.0f} ms, "
            f"p95 {1000 * p95:.0f} ms, max {1000 * ordered[-1]:.0f} ms")


async def run(url: str, sentences: list[str], max_sentences: int, texts: int, per: int,
              workers: int, alone: int) -> None:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(url, timeout=timeout) as client:
        smalls = [s for s in sentences if len(s.split()) <= 12] or sentences
        statuses: Counter[int] = Counter()
        quiet = []
        for i in range(alone):
            status, seconds = await probe(client, smalls[i % len(smalls)])
            statuses[status] += 1
            quiet.append(seconds)
        print(f"one-sentence requests alone: {summary(quiet)}; statuses {dict(statuses)}")

        large = as_texts(long_sentences(sentences, max_sentences, per), texts)
        chars = sum(map(len, large))
        before = await scrape(client)
        started = time.perf_counter()
        big = asyncio.ensure_future(client.post("/translate", json={"text": large}))
        beside, statuses = [], Counter()
        await asyncio.sleep(0.2)  # the large request is admitted and decoding
        i = 0
        while not big.done():
            status, seconds = await probe(client, smalls[i % len(smalls)])
            i += 1
            statuses[status] += 1
            if status == 200 and not big.done():
                beside.append(seconds)
        response = await big
        await response.read()
        elapsed = time.perf_counter() - started
        after = await scrape(client)
        print(f"largest allowed request: {len(large)} texts, {max_sentences} sentences of "
              f"{per} joined test sentences, {chars} characters: {response.status} in "
              f"{elapsed:.1f} s")
        print(f"one-sentence requests beside it: {summary(beside)}; statuses {dict(statuses)}")
        steps = after["translate_decode_steps_total"] - before["translate_decode_steps_total"]
        done = after["done"] - before["done"]
        tokens = (after["translate_generated_tokens_total"]
                  - before["translate_generated_tokens_total"])
        if steps and done:
            step_s = elapsed * workers / steps
            print(f"meanwhile: {steps:.0f} decoder steps over {workers} worker(s), "
                  f"{1000 * step_s:.1f} ms a step per worker, {tokens / done:.1f} tokens per "
                  f"sentence: a batch's sentence time ~{1000 * step_s * tokens / done:.0f} ms")

        over = as_texts(long_sentences(sentences, max_sentences + 1, per, seed=1), texts)
        started = time.perf_counter()
        async with client.post("/translate", json={"text": over}) as refused:
            body = await refused.json()
        print(f"one sentence over the limit: {refused.status} {body.get('error', {}).get('code')}"
              f" in {1000 * (time.perf_counter() - started):.0f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (else one is started from MODEL_DIR)")
    parser.add_argument("--model-dir", type=Path,
                        default=Path(os.environ.get("MODEL_DIR", ROOT / "models")))
    parser.add_argument("--test", type=Path, help="TSV (source first) or one sentence a line")
    parser.add_argument("--max-sentences", type=int,
                        default=int(os.environ.get("MAX_REQUEST_SENTENCES", 512)))
    parser.add_argument("--texts", type=int, default=int(os.environ.get("MAX_TEXTS", 64)))
    parser.add_argument("--join", type=int, default=3, help="test sentences per long sentence")
    parser.add_argument("--workers", type=int, default=None,
                        help="the server's workers (default: 2, the CPU default)")
    parser.add_argument("--alone", type=int, default=30, help="probes on the idle server")
    args = parser.parse_args(argv)
    test_file = args.test or next((p for p in DEFAULT_TESTS if p.is_file()), DEFAULT_TESTS[-1])
    sentences = read_sentences(test_file)
    workers = args.workers or int(os.environ.get("WORKERS", 0) or 2)
    server = None
    url = args.url
    if url is None:
        server = Server({"MODEL_DIR": str(args.model_dir)})
        server.wait_ready()
        url = server.url
    try:
        asyncio.run(run(url, sentences, args.max_sentences, args.texts, args.join, workers,
                        args.alone))
        if server is not None and (memory := server.memory_mib()) is not None:
            print(f"server memory: {memory[0]:.0f} MiB resident, {memory[1]:.0f} MiB peak")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
