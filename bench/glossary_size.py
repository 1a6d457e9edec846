"""A glossary of the largest allowed size (MAX_GLOSSARY_ENTRIES, 100,000 entries): how long
its terms take to compile, how long the event loop is held meanwhile (what /health waits for
while a request brings it), and how long matching a text takes, against the text's length.
Prints; never asserts.

    python bench/glossary_size.py                  # 100,000 entries of one to three words
    python bench/glossary_size.py --entries 20000
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import string
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.placeholders import head_commit  # noqa: E402
from service.glossary import Terms, compiled  # noqa: E402


def entries_of(count: int, rng: random.Random) -> dict[str, str]:
    def word() -> str:
        return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 10)))

    entries: dict[str, str] = {}
    while len(entries) < count:
        entries[" ".join(word() for _ in range(rng.randint(1, 3)))] = word().title()
    return entries


async def compile_watching_the_loop(entries: dict[str, str]) -> tuple[float, float, Terms]:
    """Seconds to compile, and the longest the loop waited past a 10 ms sleep meanwhile."""
    started = time.perf_counter()
    task = asyncio.ensure_future(compiled(entries))
    stall = 0.0
    while not task.done():
        tick = time.perf_counter()
        await asyncio.sleep(0.01)
        stall = max(stall, time.perf_counter() - tick - 0.01)
    return time.perf_counter() - started, stall, task.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    rng = random.Random(1)
    entries = entries_of(args.entries, rng)
    print(f"{platform.processor() or platform.machine()}, commit {head_commit()}, "
          f"{len(entries)} entries")
    seconds, stall, terms = asyncio.run(compile_watching_the_loop(entries))
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


if __name__ == "__main__":
    main()
