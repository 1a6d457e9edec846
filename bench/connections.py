"""Connection flood: more idle and byte-by-byte slow connections than the server's open-file
limit, and one ordinary client beside them.

Starts ``translate-serve`` from this checkout (or ``--code`` another one, e.g. an older commit
unpacked with ``git archive``) under a low RLIMIT_NOFILE, opens ``--idle`` connections that send
nothing and ``--slow`` ones that send a request a byte every half second, and times one
translation before, during and ``--wait`` seconds into the flood. Then it counts the flood's
connections the server answered with 408, and those it still holds open. It prints figures and
never asserts.

    python bench/connections.py                          # 1100 idle + 100 slow, 1024 files
    python bench/connections.py --code /tmp/old --model-dir models/en-de
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def translate_once(url: str, when: str) -> None:
    started = time.perf_counter()
    try:
        response = httpx.post(f"{url}/translate", json={"text": "Hello world."}, timeout=30)
        outcome = str(response.status_code)
    except httpx.HTTPError as exc:
        outcome = type(exc).__name__
    print(f"{when}: {outcome} in {1000 * (time.perf_counter() - started):.0f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose service runs")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "en-de")
    parser.add_argument("--idle", type=int, default=1100)
    parser.add_argument("--slow", type=int, default=100)
    parser.add_argument("--open-files", type=int, default=1024, help="the server's RLIMIT_NOFILE")
    parser.add_argument("--wait", type=float, default=12.0, help="seconds into the flood")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    limit = (args.open_files, args.open_files)
    server = subprocess.Popen(
        [sys.executable, "-c", "from service.main import run; run()"],
        cwd=args.code,
        env={**os.environ, "MODEL_DIR": str(args.model_dir.resolve()), "PORT": str(port),
             "HOST": "127.0.0.1", "LOG_LEVEL": "warning", "DEVICE": "cpu", "THREADS": "1",
             "WORKERS": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            time.sleep(0.2)
        translate_once(url, "before the flood")

        flood = [socket.create_connection(("127.0.0.1", port), timeout=5)
                 for _ in range(args.idle + args.slow)]
        stop = threading.Event()

        def dribble() -> None:
            request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200
            for index in range(len(request)):
                for sock in flood[args.idle:]:
                    with contextlib.suppress(OSError):
                        sock.send(request[index : index + 1])
                if stop.wait(0.5):
                    return

        threading.Thread(target=dribble, daemon=True).start()
        time.sleep(0.5)
        what = f"{args.idle} idle + {args.slow} byte-by-byte connections, {args.open_files} files"
        translate_once(url, f"{what}, 0.5 s in")
        time.sleep(args.wait)
        translate_once(url, f"{what}, {args.wait + 0.5:g} s in")
        stop.set()

        held = answered = 0
        for sock in flood:
            sock.setblocking(False)
            received = b""
            try:
                while chunk := sock.recv(65536):
                    received += chunk
            except BlockingIOError:
                held += 1  # neither answered nor closed
            except OSError:
                pass
            answered += received.startswith(b"HTTP/1.1 408")
            sock.close()
        print(f"flood connections answered 408: {answered}; still held open: {held} "
              f"of {len(flood)}")
    finally:
        server.terminate()
        _, log = server.communicate(timeout=60)
    print(f"server log lines with 'Too many open files': {log.count('Too many open files')}")


if __name__ == "__main__":
    main()
