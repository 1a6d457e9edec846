"""What sharing state through Redis costs under load: ``bench/load.py``'s clients against the
service alone and against the same service with STATE_URL (a redis-server on loopback,
started here), rounds alternating so that drift of the machine falls on both.

Both servers have a rate limit that never refuses (REQUESTS_PER_MINUTE and CHARS_PER_MINUTE
set high), so every request takes the limit path too: in the process for one, a script on
Redis for the other. Both keep their sentence cache (CACHE_MB's default); the Redis one also
looks up what its own cache misses in the shared tier and writes what it decodes there. Each
round draws from its own slice of the held-out test set (both servers the same slice), so no
round finds the sentences of an earlier one in a cache. Prints figures; never asserts.

    python bench/shared_state.py                       # 64 clients, 512 requests, 2 rounds
    python bench/shared_state.py --clients 8,64 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.load import (  # noqa: E402
    DEFAULT_TESTS,
    Server,
    _default_beam,
    free_port,
    measure_server,
    print_header,
    read_sentences,
)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="64", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=512, help="requests per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models")
    parser.add_argument("--limits-only", action="store_true",
                        help="also a Redis server without the shared cache tier")
    args = parser.parse_args(argv)
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        sys.exit("redis-server not found (Debian: apt install redis-server)")
    levels = [int(n) for n in args.clients.split(",")]
    test_file = next(p for p in DEFAULT_TESTS if p.is_file())
    sentences = read_sentences(test_file)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"# bench/shared_state.py  commit {commit}  CPU: {cpu_name()}, {os.cpu_count()} "
          f"cores  {test_file.name}: {len(sentences)} sentences, {args.requests} requests a "
          "run")
    port = free_port()
    workdir = tempfile.mkdtemp()
    redis = subprocess.Popen([redis_server, "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", workdir],
                             stdout=subprocess.DEVNULL)
    common = {"MODEL_DIR": str(args.model_dir), "REQUESTS_PER_MINUTE": "100000000",
              "CHARS_PER_MINUTE": "1000000000", "DATA_DIR": workdir}
    shared = {**common, "STATE_URL": f"redis://127.0.0.1:{port}/0"}
    servers = {"in-process": Server(common), "redis": Server(shared)}
    if args.limits_only:
        servers["redis, no cache tier"] = Server({**shared, "SHARED_CACHE_ENTRIES": "0"})
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        for server in servers.values():
            server.wait_ready()
        beam = _default_beam()
        print_header()
        for round_ in range(args.rounds):
            fresh = sentences[round_::args.rounds]
            for label, server in servers.items():
                for result in measure_server(server.url, label, levels, fresh, args.requests,
                                             {}, beam):
                    rates.setdefault((label, result.clients), []).append(
                        result.sentences_per_s)
    finally:
        for server in servers.values():
            server.stop()
        redis.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    for clients in levels:
        alone = statistics.median(rates["in-process", clients])
        for label in list(servers)[1:]:
            rate = statistics.median(rates[label, clients])
            print(f"{clients} clients: in-process {alone:.1f} sentences/s, {label} {rate:.1f} "
                  f"(medians of {args.rounds}): {rate / alone:.2f}x")


if __name__ == "__main__":
    main()
