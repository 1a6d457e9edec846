"""A document's speed against the same text sent to /translate, and what it does to small
requests' latency.

Starts ``translate-serve`` on a bundle (sentence cache off), makes a plain-text document of
``--paragraphs`` held-out sentences (one a paragraph), and times: the document through
``POST /translate/document`` until it is done; the same paragraphs through ``/translate`` in
requests of MAX_TEXTS texts, four at a time; and one-sentence requests sent one after another
while idle, while the texts are translated and while the document is (median and p90).
Prints figures; never asserts.

    python bench/documents.py                       # models/en-de, 1,000 paragraphs
    python bench/documents.py --paragraphs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.page import one_sentence_texts, percentile, server  # noqa: E402
from bench.placeholders import cpu_model, head_commit  # noqa: E402

DEFAULT_TESTS = (ROOT / "runs/en-de/data/test.tsv", ROOT / "tests/fixtures/overfit.tsv")
TEXTS_PER_REQUEST = 64  # MAX_TEXTS's default


async def document_seconds(client: httpx.AsyncClient, text: str) -> float:
    started = time.perf_counter()
    accepted = (await client.post("/translate/document", data={"target_lang": "de"},
                                  files={"file": ("bench.txt", text.encode())})).json()
    where = f"/translate/document/{accepted['document_id']}"
    key = {"document_key": accepted["document_key"]}
    while (await client.get(where, params=key)).json()["status"] not in ("done", "error"):
        await asyncio.sleep(0.05)
    seconds = time.perf_counter() - started
    await client.get(where + "/result", params=key)
    return seconds


async def texts_seconds(client: httpx.AsyncClient, paragraphs: list[str]) -> float:
    started = time.perf_counter()
    chunks = [paragraphs[i:i + TEXTS_PER_REQUEST]
              for i in range(0, len(paragraphs), TEXTS_PER_REQUEST)]
    gate = asyncio.Semaphore(4)

    async def send(chunk: list[str]) -> None:
        async with gate:
            response = await client.post("/translate", json={"text": chunk})
            response.raise_for_status()

    await asyncio.gather(*(send(chunk) for chunk in chunks))
    return time.perf_counter() - started


async def small_latencies(client: httpx.AsyncClient, texts: list[str],
                          until: asyncio.Task | None = None) -> list[float]:
    latencies = []
    for text in texts:
        if until is not None and until.done():
            break
        started = time.perf_counter()
        (await client.post("/translate", json={"text": text})).raise_for_status()
        latencies.append(1000 * (time.perf_counter() - started))
    return latencies


async def measure(url: str, paragraphs: list[str], probes: list[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await texts_seconds(client, paragraphs[:64])  # warm
        # and the document path: its first upload starts the document worker processes
        await document_seconds(client, "\n\n".join(paragraphs[:8]))
        idle = await small_latencies(client, probes)
        texts = asyncio.create_task(texts_seconds(client, paragraphs))
        await asyncio.sleep(0.2)
        beside_texts = await small_latencies(client, probes * 20, until=texts)
        as_texts = await texts
        document = asyncio.create_task(document_seconds(client, "\n\n".join(paragraphs)))
        await asyncio.sleep(0.2)
        busy = await small_latencies(client, probes * 20, until=document)
        as_document = await document
    count = len(paragraphs)
    print(f"# bench/documents.py  commit {head_commit()}  CPU: {cpu_model()}, "
          f"{os.cpu_count()} cores  {count} one-sentence paragraphs, sentence cache off")
    print("| as | seconds | sentences/s |")
    print("|---|---:|---:|")
    print(f"| /translate, {TEXTS_PER_REQUEST} texts a request, 4 at a time | {as_texts:.1f} | "
          f"{count / as_texts:.1f} |")
    print(f"| one document (/translate/document, until done) | {as_document:.1f} | "
          f"{count / as_document:.1f} |")
    print(f"document / texts: {as_texts / as_document:.2f}x")
    print("| one-sentence requests (ms) | median | p90 | n |")
    print("|---|---:|---:|---:|")
    for label, values in (("idle", idle), ("while the same text goes to /translate",
                                            beside_texts),
                          ("while the document is translated", busy)):
        print(f"| {label} | {statistics.median(values):.0f} | {percentile(values, 0.9):.0f} | "
              f"{len(values)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=str(ROOT / "models/en-de"))
    parser.add_argument("--test", type=Path,
                        default=next((p for p in DEFAULT_TESTS if p.exists()), DEFAULT_TESTS[-1]))
    parser.add_argument("--paragraphs", type=int, default=1000)
    args = parser.parse_args()
    texts = one_sentence_texts(args.test, args.paragraphs + 20)
    paragraphs, probes = texts[20:], texts[:20]
    with server(args.model_dir) as url:
        asyncio.run(measure(url, paragraphs, probes))


if __name__ == "__main__":
    main()
