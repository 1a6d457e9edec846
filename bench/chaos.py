"""Reliability under abuse: a bounded run of the ways a service in production gets hurt.

Phases, each about ``--seconds`` long, against one server:

1. capacity: 64 clients, one sentence a request, as fast as answers come (sentences/s);
2. overload: requests arriving at 3x that rate (open loop: arrivals do not wait for answers);
3. the largest request the limits allow (MAX_REQUEST_SENTENCES sentences) beside 8 clients
   sending one sentence at a time;
4. slow clients: idle connections and connections sending their request a byte a second,
   while 4 normal clients send requests;
5. an injected decoder fault (``--faults``, only on a server this script starts: it serves
   through ``tests/faults.py``'s engine wrapper, which fails every step with one chosen
   sentence in the batch; the service itself has no switch for it): 16 clients, every tenth
   request carries that sentence;
6. SIGTERM under load (only on a server this script starts): 32 clients, the signal after a
   second, until the server exits.

For each phase: the responses by status, lost requests (sent, and no HTTP answer came: a
connection reset or a client timeout), the 200s' median and p99 latency, and the server's
resident memory after it (on a server this script starts). It prints figures and asserts
nothing.

    python bench/chaos.py                          # starts a server from MODEL_DIR
    python bench/chaos.py --faults --seconds 10    # also the injected fault
    python bench/chaos.py --url http://localhost:8000 --skip sigterm
    python bench/chaos.py --env MAX_QUEUE=256 --skip largest   # a queue that fills in seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

# This checkout's service and tests come first: an installed copy (``pip install -e`` of another
# checkout) would otherwise be what the --faults server serves.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fairness import as_texts, long_sentences
from load import DEFAULT_TESTS, ROOT, Server, read_sentences

from service.text import estimate_sentences

POISON = "The chaos monkey breaks this very sentence."
PHASES = ("capacity", "overload", "largest", "slow", "fault", "sigterm")


@dataclass
class Tally:
    phase: str
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lost: Counter[str] = field(default_factory=Counter)
    refused: int = 0  # connections not accepted (no request was sent)
    seconds: float = 0.0
    note: str = ""

    def record(self, status: int, seconds: float) -> None:
        self.statuses[str(status)] += 1
        if status == 200:
            self.latencies.append(seconds)

    def line(self, memory: str) -> str:
        ordered = sorted(self.latencies)
        p50 = f"{1000 * statistics.median(ordered):.0f}" if ordered else "-"
        p99 = f"{1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]:.0f}" \
            if ordered else "-"
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(self.statuses.items())) or "-"
        lost = sum(self.lost.values())
        detail = f" ({', '.join(f'{k} {v}' for k, v in self.lost.items())})" if lost else ""
        refused = f", {self.refused} refused connections" if self.refused else ""
        return (f"{self.phase:<9} {self.seconds:>5.1f} s  {statuses:<24} lost {lost}{detail}"
                f"{refused}  p50 {p50} ms  p99 {p99} ms  {memory}  {self.note}").rstrip()


async def post(client: aiohttp.ClientSession, tally: Tally, payload: dict) -> int | None:
    started = time.perf_counter()
    try:
        async with client.post("/translate", json=payload) as response:
            await response.read()
    except aiohttp.ClientConnectorError:
        tally.refused += 1
        return None
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.lost[type(exc).__name__] += 1
        return None
    tally.record(response.status, time.perf_counter() - started)
    return response.status


async def closed_loop(client, tally: Tally, texts: list[str], clients: int, until: float,
                      pick=None) -> None:
    async def one(seed: int) -> None:
        pool = random.Random(seed)
        while time.monotonic() < until:
            text = pick(pool) if pick else pool.choice(texts)
            await post(client, tally, {"text": text})

    await asyncio.gather(*(one(i) for i in range(clients)))


async def capacity(client, texts: list[str], seconds: float) -> tuple[Tally, float]:
    tally = Tally("capacity")
    started = time.monotonic()
    await closed_loop(client, tally, texts, 64, started + seconds)
    tally.seconds = time.monotonic() - started
    rate = len(tally.latencies) / tally.seconds
    tally.note = f"{rate:.0f} sentences/s"
    return tally, rate


async def overload(client, texts: list[str], seconds: float, rate: float) -> Tally:
    """Poisson arrivals at ``rate`` a second, none waiting for another's answer."""
    tally = Tally("overload")
    pool = random.Random(3)
    started = time.monotonic()
    tasks = []
    due = started
    while (now := time.monotonic()) < started + seconds:
        while due <= now:  # catch up when the client itself falls behind the schedule
            tasks.append(asyncio.ensure_future(post(client, tally, {"text": pool.choice(texts)})))
            due += pool.expovariate(rate)
        await asyncio.sleep(due - now)
    sent = len(tasks)
    await asyncio.gather(*tasks)
    tally.seconds = time.monotonic() - started
    tally.note = f"{rate:.0f} requests/s meant, {sent / seconds:.0f} sent"
    return tally


async def largest(client, texts: list[str], seconds: float, sentences: int,
                  max_texts: int) -> Tally:
    tally = Tally("largest")
    # Single short sentences, so that the request is within MAX_REQUEST_SENTENCES and
    # MAX_REQUEST_CHARS both: test lines may hold several sentences (Bible verses).
    single = [t for t in texts if len(t) <= 90 and estimate_sentences(t) == 1]
    large = as_texts(long_sentences(single, sentences, 1), max_texts)
    started = time.monotonic()
    big = Tally("big")
    big_task = asyncio.ensure_future(post(client, big, {"text": large}))
    await closed_loop(client, tally, texts, 8, started + seconds)
    await big_task
    tally.seconds = time.monotonic() - started
    outcome = next(iter(big.statuses), "lost")
    big_seconds = big.latencies[0] if big.latencies else None
    tally.note = (f"the {sentences}-sentence request: {outcome}"
                  + (f" in {big_seconds:.1f} s" if big_seconds else ""))
    return tally


async def slow(client, url: str, texts: list[str], seconds: float, idle: int,
               trickling: int) -> Tally:
    """Idle sockets and sockets sending a request a byte a second, beside normal clients."""
    tally = Tally("slow")
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = json.dumps({"text": "slow"}).encode()
    request = (f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    closed = Counter()
    until = time.monotonic() + seconds

    async def hold(send: bool) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            closed["refused"] += 1
            return
        try:
            for byte in request if send else b"":
                if time.monotonic() >= until:
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)
            while time.monotonic() < until:
                if reader.at_eof():
                    closed["closed by server"] += 1
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1024), 0.5)
        except OSError:
            closed["closed by server"] += 1
        finally:
            writer.close()

    started = time.monotonic()
    holders = [asyncio.ensure_future(hold(False)) for _ in range(idle)]
    holders += [asyncio.ensure_future(hold(True)) for _ in range(trickling)]
    await asyncio.sleep(1)  # connections open before the normal clients start
    await closed_loop(client, tally, texts, 4, until)
    await asyncio.gather(*holders)
    tally.seconds = time.monotonic() - started
    kept = idle + trickling - sum(closed.values())
    tally.note = ", ".join([f"{idle} idle + {trickling} trickling sockets: {kept} held open "
                            "to the end", *(f"{v} {k}" for k, v in closed.items())])
    return tally


async def fault(client, texts: list[str], seconds: float) -> Tally:
    tally = Tally("fault")
    poisoned = Tally("poisoned")
    counter = iter(range(10**9))

    async def one() -> None:
        while time.monotonic() < until:
            if next(counter) % 10 == 0:
                await post(client, poisoned, {"text": POISON})
            else:
                await post(client, tally, {"text": random.choice(texts)})

    started = time.monotonic()
    until = started + seconds
    await asyncio.gather(*(one() for _ in range(16)))
    tally.seconds = time.monotonic() - started
    async with client.get("/ready") as ready:
        ready_status = ready.status
    statuses = " ".join(f"{k}:{v}" for k, v in sorted(poisoned.statuses.items()))
    tally.note = f"poisoned requests: {statuses}; /ready {ready_status} after"
    return tally


async def sigterm(client, texts: list[str], server: Server) -> Tally:
    tally = Tally("sigterm")
    started = time.monotonic()

    async def one(seed: int) -> None:
        pool = random.Random(seed)
        while server.process.poll() is None:
            status = await post(client, tally, {"text": pool.choice(texts)})
            if status is None:
                await asyncio.sleep(0.05)

    clients = [asyncio.ensure_future(one(i)) for i in range(32)]
    await asyncio.sleep(1)
    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    await asyncio.gather(*clients)
    tally.seconds = time.monotonic() - started
    tally.note = f"exited {time.monotonic() - signalled:.1f} s after SIGTERM"
    return tally


def memory(server: Server | None) -> str:
    measured = server.memory_mib() if server is not None else None
    return f"rss {measured[0]:.0f} MiB (peak {measured[1]:.0f})" if measured else ""


async def run(args: argparse.Namespace, url: str, server: Server | None) -> None:
    texts = [s for s in read_sentences(args.test) if len(s.split()) <= 20]
    timeout = aiohttp.ClientTimeout(total=args.client_timeout)
    # No connection limit: the overload phase needs its connections. Idle ones are closed
    # before the server's keep-alive timeout (5 s) can close them under a new request.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=connector) as client:
        rate = None
        for phase in PHASES:
            if phase in args.skip:
                continue
            if phase in ("fault", "sigterm") and server is None:
                print(f"{phase:<9} skipped: needs a server this script starts")
                continue
            if phase == "fault" and not args.faults:
                print("fault     skipped: run with --faults (a server serving through "
                      "tests/faults.py; the service has no fault switch of its own)")
                continue
            if phase == "capacity":
                tally, rate = await capacity(client, texts, args.seconds)
            elif phase == "overload":
                if rate is None:
                    _, rate = await capacity(client, texts, args.seconds)
                tally = await overload(client, texts, args.seconds, 3 * rate)
            elif phase == "largest":
                tally = await largest(client, texts, args.seconds, args.max_sentences,
                                      args.texts)
            elif phase == "slow":
                tally = await slow(client, url, texts, args.seconds, args.idle, args.trickling)
            elif phase == "fault":
                tally = await fault(client, texts, args.seconds)
            else:
                assert server is not None
                tally = await sigterm(client, texts, server)
            print(tally.line(memory(server)), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (else one is started from MODEL_DIR)")
    parser.add_argument("--model-dir", type=Path,
                        default=Path(os.environ.get("MODEL_DIR", ROOT / "models")))
    parser.add_argument("--test", type=Path,
                        default=next((p for p in DEFAULT_TESTS if p.is_file()), DEFAULT_TESTS[-1]))
    parser.add_argument("--seconds", type=float, default=15, help="length of each phase")
    parser.add_argument("--faults", action="store_true",
                        help="serve through tests/faults.py and run the fault phase")
    parser.add_argument("--skip", default="", help=f"comma-separated phases of {PHASES}")
    parser.add_argument("--max-sentences", type=int,
                        default=int(os.environ.get("MAX_REQUEST_SENTENCES", 512)))
    parser.add_argument("--texts", type=int, default=int(os.environ.get("MAX_TEXTS", 64)))
    parser.add_argument("--idle", type=int, default=300, help="idle sockets in the slow phase")
    parser.add_argument("--trickling", type=int, default=300,
                        help="sockets sending a byte a second in the slow phase")
    parser.add_argument("--client-timeout", type=float, default=60)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the server this script starts (e.g. MAX_QUEUE=256)")
    parser.add_argument("--serve-with-faults", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_with_faults:
        serve_with_faults()
        return
    args.skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    server = None
    url = args.url
    if url is None:
        command = [str(Path(__file__).resolve()), "--serve-with-faults"] if args.faults else None
        env = dict(item.split("=", 1) for item in args.env)
        server = Server({"MODEL_DIR": str(args.model_dir), **env}, command)
        server.wait_ready()
        url = server.url
    print(f"{'phase':<9} {'time':>7}  {'responses by status':<28} lost ...")
    try:
        asyncio.run(run(args, url, server))
    finally:
        if server is not None and server.process.poll() is None:
            server.stop()


def serve_with_faults() -> None:
    """The service, configured from the environment as ``translate-serve`` is, whose engines
    fail every decoder step while POISON is in the batch (a test mode: tests/faults.py)."""
    from service.loading import default_engine
    from service.main import create_app, server_for
    from service.settings import Settings
    from tests.faults import Faults, FaultyEngine

    settings = Settings()
    faults = Faults()

    def factory(directory: Path, settings: Settings) -> FaultyEngine:
        engine = default_engine(directory, settings)
        faults.poison = tuple(engine.tokenize(POISON))
        return FaultyEngine(engine, faults)

    server_for(create_app(settings, engine_factory=factory), settings).run()


if __name__ == "__main__":
    main()
