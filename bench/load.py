"""Load test: concurrent clients against the HTTP service, batching on vs off, vs offline.

For each client count (default 1, 8, 64) N clients post single sentences of mixed length, drawn
from a test file, as fast as answers come back. Reported per run: sentences/s, target tokens/s
(from the server's own ``translate_generated_tokens_total``), p50/p95/p99 latency and errors.

By default the script starts the server twice from MODEL_DIR (``BATCHING=true`` with the
service's default workers, then ``BATCHING=false WORKERS=1``: one sentence at a time), measures
the engine's offline batch-32 throughput in-process (with the server's workers sharing the
batches), and the bare engine's latency on the very texts the 1-client run posts (split into
sentences as the server splits them), and prints the ratios. ``--url`` measures an already
running server instead (add ``--url-unbatched`` for the comparison). It prints figures and
never asserts.

    python bench/load.py                                # models/, test set or fixture
    python bench/load.py --model-dir models/en-de --clients 1,8,64 --requests 512
    python bench/load.py --url http://localhost:8000 --no-offline
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = (ROOT / "runs/en-de/data/test.tsv", ROOT / "tests/fixtures/overfit.tsv")
_TOKENS = re.compile(r"^translate_generated_tokens_total\{[^}]*\} (\S+)$", re.MULTILINE)


@dataclass
class RunResult:
    label: str
    clients: int
    sentences: int = 0
    seconds: float = 0.0
    tokens: float | None = None
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.tokens is not None and self.seconds else None

    def percentile(self, q: int) -> float | None:
        if len(self.latencies) < 2:
            return self.latencies[0] if self.latencies else None
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[q - 1]


def read_sentences(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0].strip() for line in lines if line.strip()]


async def generated_tokens(client: aiohttp.ClientSession) -> float | None:
    try:
        async with client.get("/metrics") as response:
            text = await response.text()
    except aiohttp.ClientError:
        return None
    values = [float(v) for v in _TOKENS.findall(text)]
    return sum(values) if values else None


def draw(sentences: list[str], clients: int, requests: int) -> list[str]:
    """The sentences a run posts: the same draw for batched, unbatched and engine runs."""
    pool = random.Random(clients)
    return [pool.choice(sentences) for _ in range(requests)]


async def load_run(
    url: str, label: str, clients: int, sentences: list[str], requests: int, headers: dict,
    beam_size: int,
) -> RunResult:
    result = RunResult(label, clients)
    work = draw(sentences, clients, requests)
    # The clients share the server's cores: aiohttp costs ~1 ms of CPU a request where httpx
    # cost ~6 (measured at 64 clients on the 2-core machine), time the server would lose.
    async with aiohttp.ClientSession(
        url,
        connector=aiohttp.TCPConnector(limit=clients),
        timeout=aiohttp.ClientTimeout(total=120),
        headers=headers,
    ) as client:
        before = await generated_tokens(client)

        async def worker() -> None:
            while work:
                text = work.pop()
                started = time.perf_counter()
                try:
                    async with client.post(
                        "/translate", json={"text": text, "beam_size": beam_size}
                    ) as response:
                        await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    result.errors[type(exc).__name__] += 1
                    continue
                if response.status == 200:
                    result.latencies.append(time.perf_counter() - started)
                    result.sentences += 1
                else:
                    result.errors[str(response.status)] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        result.seconds = time.perf_counter() - started
        after = await generated_tokens(client)
    if before is not None and after is not None:
        result.tokens = after - before
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``translate-serve`` in a subprocess with extra environment (or ``command``, arguments
    to Python that serve the same way)."""

    def __init__(self, env: dict[str, str], command: list[str] | None = None,
                 checkout: Path = ROOT) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environment = {
            **os.environ,
            **env,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "LOG_LEVEL": "warning",
        }
        self.process = subprocess.Popen(
            [sys.executable, *(command or ["-c", "from service.main import run; run()"])],
            cwd=checkout,  # whose service package ``-c`` imports (the current directory's)
            env=environment,
        )

    ready_path = "/ready"  # answers 200 once the server serves

    def wait_ready(self, timeout: float = 300) -> None:
        stop = time.monotonic() + timeout
        while time.monotonic() < stop:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=2):
                    return  # 200; 503 (still loading) raises HTTPError
            except OSError:  # URLError, HTTPError, refused connection
                pass
            time.sleep(0.2)
        raise RuntimeError("server not ready in time")

    def memory_mib(self) -> tuple[float, float] | None:
        """(resident now, peak resident) of the server process, from Linux's /proc."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))
        except (KeyError, ValueError):
            return None

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def measure_server(
    url: str, label: str, levels: list[int], sentences: list[str], requests: int, headers: dict,
    beam_size: int,
) -> list[RunResult]:
    results = []
    for clients in levels:
        result = asyncio.run(
            load_run(url, label, clients, sentences, max(requests, clients), headers, beam_size)
        )
        print_row(result)
        results.append(result)
    return results


def _service_importable() -> None:
    if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
        sys.path.insert(0, str(ROOT))


def offline_engine(model_dir: Path):
    """The engine the server would load first from ``model_dir``, in this process."""
    _service_importable()
    from service.engine import Engine
    from service.loading import bundle_dirs

    directories = bundle_dirs(model_dir)
    if not directories:
        raise RuntimeError(f"no bundle in {model_dir}")
    return Engine(
        directories[0],
        device=os.environ.get("DEVICE", "auto"),
        threads=_int_from_env("THREADS"),
        workers=_int_from_env("WORKERS"),
    )


def _fitting(engine, sentences: list[str]) -> list[str]:
    # Offline translate refuses sentences over the model's positions (the server splits them).
    fitting = [s for s in sentences if len(engine.tokenize(s)) <= engine.max_source_tokens]
    if len(fitting) < len(sentences):
        print(f"offline: left out {len(sentences) - len(fitting)} sentences over the positions")
    return fitting


def measure_offline(engine, sentences: list[str], beam_size: int, batch: int = 32) -> RunResult:
    """The engine's throughput on static batches of ``batch`` sentences in the file's order (as
    a client with batches to translate would send them), no HTTP. The engine's workers take
    the next batch as they come free, as CTranslate2's ``inter_threads`` do."""
    sentences = _fitting(engine, sentences)
    rows = batch * beam_size  # `batch` sentences a call, each beam_size rows
    for replica in engine.replicas:
        replica.translate(sentences[:batch], max_batch_rows=rows, beam_size=beam_size)  # warm-up
    batches = [sentences[i : i + batch] for i in range(0, len(sentences), batch)]
    result = RunResult(f"offline batch-{batch}", batch)
    started = time.perf_counter()
    done = engine.on_replicas(
        batches,
        lambda replica, sources: replica.translate(
            sources, max_batch_rows=rows, beam_size=beam_size
        ),
    )
    result.seconds = time.perf_counter() - started
    result.sentences = len(sentences)
    result.tokens = sum(len(t.hypotheses[0].token_ids) for part in done for t in part)
    return result


def measure_engine_latency(engine, work: list[str], beam_size: int) -> RunResult:
    """The bare engine's latency over exactly the texts one client posts, each split into
    sentences as the server splits it (15% of test lines hold several) and decoded together."""
    from service.text import split_sentences

    work = _fitting(engine, work)
    engine.translate(work[:4], beam_size=beam_size)  # warm-up
    result = RunResult("engine batch-1", 1)
    tokens = 0
    for text in work:
        pieces = list(split_sentences(text).pieces)
        started = time.perf_counter()
        translations = engine.translate(pieces, beam_size=beam_size)
        result.latencies.append(time.perf_counter() - started)
        tokens += sum(len(t.hypotheses[0].token_ids) for t in translations)
    result.seconds = sum(result.latencies)
    result.sentences = len(work)
    result.tokens = tokens
    return result


def _default_beam() -> int:
    """The beam a request without one gets from a server started here (DEFAULT_BEAM)."""
    _service_importable()
    from service.settings import Settings

    return Settings().default_beam


def _int_from_env(name: str) -> int:
    """The server's setting, so the offline engine matches it (0: the service's default)."""
    try:
        return int(os.environ.get(name, "0"))
    except ValueError:
        return 0


def _ms(value: float | None) -> str:
    return f"{value * 1000:8.1f}" if value is not None else "       -"


def print_header() -> None:
    print(
        f"{'run':<18} {'clients':>7} {'sent/s':>9} {'tok/s':>9} "
        f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  errors"
    )


def print_row(result: RunResult) -> None:
    tokens = result.tokens_per_s
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(result.errors.items())) or "0"
    print(
        f"{result.label:<18} {result.clients:>7} {result.sentences_per_s:>9.1f} "
        f"{(f'{tokens:.0f}' if tokens is not None else '-'):>9} "
        f"{_ms(result.percentile(50))} {_ms(result.percentile(95))} "
        f"{_ms(result.percentile(99))}  {errors}",
        flush=True,
    )


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="measure this running server instead of starting one")
    parser.add_argument("--url-unbatched", help="a running server with BATCHING=false")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=Path(os.environ.get("MODEL_DIR", ROOT / "models")),
        help="bundle (or directory of bundles) for started servers and the offline run",
    )
    parser.add_argument("--test", type=Path, help="TSV (source first) or one sentence a line")
    parser.add_argument("--clients", default="1,8,64", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=256, help="requests per run")
    parser.add_argument(
        "--beam-size", type=int, default=None,
        help="beam_size of every request and of the offline runs (default: the service's "
        "DEFAULT_BEAM)",
    )
    parser.add_argument("--api-key", default=os.environ.get("API_KEY"))
    parser.add_argument("--no-offline", action="store_true", help="skip the offline engine run")
    args = parser.parse_args(argv)

    beam_size = args.beam_size or _default_beam()
    test_file = args.test or next((p for p in DEFAULT_TESTS if p.is_file()), DEFAULT_TESTS[-1])
    sentences = read_sentences(test_file)
    levels = [int(n) for n in args.clients.split(",") if n.strip()]
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    lengths = sorted(len(s.split()) for s in sentences)
    print(
        f"test file {test_file}: {len(sentences)} sentences, "
        f"{lengths[0]}-{lengths[-1]} words (median {statistics.median(lengths):.0f}); "
        f"beam_size {beam_size}"
    )
    print_header()

    batched: list[RunResult] = []
    unbatched: list[RunResult] = []
    if args.url:
        batched = measure_server(
            args.url, "batched", levels, sentences, args.requests, headers, beam_size
        )
        if args.url_unbatched:
            unbatched = measure_server(
                args.url_unbatched, "unbatched", levels, sentences, args.requests, headers,
                beam_size,
            )
    else:
        runs = (
            ("batched", {"BATCHING": "true"}, batched),
            ("unbatched", {"BATCHING": "false", "WORKERS": "1"}, unbatched),
        )
        for label, env, into in runs:
            server = Server({"MODEL_DIR": str(args.model_dir), **env})
            try:
                server.wait_ready()
                into += measure_server(
                    server.url, label, levels, sentences, args.requests, headers, beam_size
                )
                memory = server.memory_mib()
                if memory is not None:
                    print(f"{label} server memory: {memory[0]:.0f} MiB resident after the "
                          f"runs, {memory[1]:.0f} MiB peak")
            finally:
                server.stop()

    offline = engine_alone = None
    if not args.no_offline:
        try:
            engine = offline_engine(args.model_dir)
            offline = measure_offline(engine, sentences, beam_size)
            print_row(offline)
            if 1 in levels:
                engine_alone = measure_engine_latency(
                    engine, draw(sentences, 1, args.requests), beam_size
                )
                print_row(engine_alone)
        except Exception as exc:  # a bench reports, it does not fail
            print(f"offline run skipped: {exc}")

    print()
    for on, off in zip(batched, unbatched, strict=False):
        print(
            f"batching on/off at {on.clients:>2} clients: "
            f"{ratio(on.sentences_per_s, off.sentences_per_s)} sentences/s, "
            f"p50 latency {ratio(on.percentile(50), off.percentile(50))}"
        )
    if offline is not None:
        for on in batched:
            print(
                f"server ({on.clients:>2} clients) / offline batch-32: "
                f"{ratio(on.sentences_per_s, offline.sentences_per_s)} sentences/s"
            )
    one_client = next((r for r in batched if r.clients == 1), None)
    if engine_alone is not None and one_client is not None:
        print(
            f"server (1 client) / engine batch-1, same sentences: p50 latency "
            f"{ratio(one_client.percentile(50), engine_alone.percentile(50))}"
        )


if __name__ == "__main__":
    main()
