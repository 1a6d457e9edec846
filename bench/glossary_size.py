"""A glossary of the largest allowed size (MAX_GLOSSARY_ENTRIES, 100,000 entries): how long
its terms take to compile, how long the event loop is held meanwhile (what /health waits for
while a request brings it), and how long matching a text takes, against the text's length;
then how long a ``/translate`` body carrying it inline takes to parse, and each use of it
stored in Redis (STATE_URL, a redis-server on loopback started here when one is installed),
each with the longest the event loop was held meanwhile and, for Redis, the bytes it sent.
Prints; never asserts.

    python bench/glossary_size.py                  # 100,000 entries of one to three words
    python bench/glossary_size.py --entries 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import shutil
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.load import free_port  # noqa: E402
from bench.placeholders import cpu_model, head_commit  # noqa: E402
from service import glossary as glossary_module  # noqa: E402
from service.api.native import _parse  # noqa: E402
from service.api.schemas import TranslateRequest  # noqa: E402
from service.glossary import SharedGlossaryStore, compiled  # noqa: E402
from service.shared_state import StateStore  # noqa: E402

T = TypeVar("T")


def entries_of(count: int, rng: random.Random) -> dict[str, str]:
    def word() -> str:
        return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 10)))

    entries: dict[str, str] = {}
    while len(entries) < count:
        entries[" ".join(word() for _ in range(rng.randint(1, 3)))] = word().title()
    return entries


async def watching_the_loop(work: Awaitable[T]) -> tuple[float, float, T]:
    """Seconds ``work`` took, and the longest the loop waited past a 10 ms sleep meanwhile."""
    started = time.perf_counter()
    task = asyncio.ensure_future(work)
    stall = 0.0
    while not task.done():
        tick = time.perf_counter()
        await asyncio.sleep(0.01)
        stall = max(stall, time.perf_counter() - tick - 0.01)
    return time.perf_counter() - started, stall, task.result()


def inline_body(entries: dict[str, str]) -> None:
    """A native /translate body carrying the glossary, parsed as the service parses a large
    body (in a thread), against one pydantic call over the whole body."""
    body = json.dumps({"text": "Hello world.", "target_lang": "de",
                       "glossary": entries}).encode()
    for _ in range(3):
        seconds, stall, _ = asyncio.run(watching_the_loop(asyncio.to_thread(_parse, body)))
        started = time.perf_counter()
        TranslateRequest.model_validate_json(body)
        whole = time.perf_counter() - started
        print(f"inline body ({len(body) / 1e6:.1f} MB): parsed in {seconds * 1000:.0f} ms, "
              f"longest event-loop stall meanwhile {stall * 1000:.0f} ms (one pydantic call "
              f"over the whole body: {whole * 1000:.0f} ms)")


def stored_in_redis(entries: dict[str, str]) -> None:
    """The glossary created in Redis, then used (read by id) a few times."""
    server = shutil.which("redis-server")
    if server is None:
        print("stored in Redis: skipped, no redis-server (Debian: apt install redis-server)")
        return
    port, workdir = free_port(), tempfile.mkdtemp()
    redis = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", workdir],
                             stdout=subprocess.DEVNULL)

    async def run() -> None:
        store = StateStore(f"redis://127.0.0.1:{port}/0", timeout_s=5)
        for _ in range(100):  # until it answers
            try:
                await store.redis.ping()
                break
            except OSError:
                await asyncio.sleep(0.05)
        glossaries = SharedGlossaryStore(store)

        async def sent() -> int:
            return int((await store.redis.info("stats"))["total_net_output_bytes"])

        seconds, stall, made = await watching_the_loop(
            glossaries.create("large", {("en", "de"): entries}))
        print(f"Redis: created in {seconds * 1000:.0f} ms, longest event-loop stall "
              f"{stall * 1000:.0f} ms")

        async def use(label: str) -> None:
            before = await sent()
            seconds, stall, _ = await watching_the_loop(glossaries.get(made.glossary_id))
            print(f"Redis: {label} in {seconds * 1000:.0f} ms, longest event-loop stall "
                  f"{stall * 1000:.0f} ms, {(await sent() - before) / 1e3:.0f} kB from Redis")

        for number in (1, 2):
            await use(f"use {number} on the replica that created it")
        # Another replica: a process that has parsed no glossary yet.
        glossary_module._loaded = glossary_module._Loaded(8)
        for number in (1, 2):
            await use(f"use {number} on another replica")
        await store.close()

    try:
        asyncio.run(run())
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    rng = random.Random(1)
    entries = entries_of(args.entries, rng)
    print(f"{cpu_model() or platform.machine()}, commit {head_commit()}, "
          f"{len(entries)} entries")
    seconds, stall, terms = asyncio.run(watching_the_loop(compiled(entries)))
    print(f"compile: {seconds:.2f} s; longest event-loop stall meanwhile: {stall * 1000:.0f} ms")
    started = time.perf_counter()
    asyncio.run(compiled(entries))
    print(f"again (cached, by content): {(time.perf_counter() - started) * 1000:.0f} ms")
    terms_list = list(entries)
    for words in (20, 200, 2000):
        text = " ".join(rng.choice(terms_list) if rng.random() < 0.1 else "the"
                        for _ in range(words))
        rounds = max(1, 2000 // words)
        started = time.perf_counter()
        for _ in range(rounds):
            found = terms.find(text)
        each = (time.perf_counter() - started) / rounds
        print(f"match {len(text):>6} characters: {each * 1000:.2f} ms ({len(found)} terms)")
    inline_body(entries)
    stored_in_redis(entries)


if __name__ == "__main__":
    main()
