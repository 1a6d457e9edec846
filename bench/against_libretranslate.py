"""This service against LibreTranslate, serving the same weights, driven by one client.

    bench/libretranslate-venv.sh /work/lt-venv          # once: LibreTranslate from PyPI
    python bench/against_libretranslate.py --lt-venv /work/lt-venv \
        --test runs/en-de/data/test.tsv --test runs/en-de/data/dev.tsv --requests 500
    python bench/random_marian.py /tmp/opus-size --text runs/en-de/data/dev.tsv --eos-bias 6
    python bench/against_libretranslate.py --lt-venv /work/lt-venv --marian /tmp/opus-size \
        --test runs/en-de/data/test.tsv --requests 100

What it builds (in a scratch directory, or ``--work``, where a second run reuses it):

* From ``--bundle`` (default ``models/en-de``): the bundle's weights as a checkpoint
  (``training.recover``), converted to CTranslate2 int8 by ``bench/ctranslate2_convert.py``,
  with ``add_source_eos``/``add_source_bos`` set in the model's config as the bundle's
  manifest asks (Argos passes bare SentencePiece pieces; CTranslate2 then appends the ``</s>``
  the model was trained with). The bundle itself is served by this service.
* From ``--marian DIR`` (a MarianMT directory, e.g. ``bench/random_marian.py``'s Opus-MT-size
  model): CTranslate2's own converter (int8) for LibreTranslate, ``translate-train import``
  (int8, calibrated on the test sentences) for this service.
* An Argos package, ``translate-en_de-1_0.argosmodel``: ``metadata.json``, ``model/`` (the
  CTranslate2 model), ``sentencepiece.model`` (the source side's), installed by unpacking it
  into ``ARGOS_PACKAGES_DIR`` as ``argospm install`` does.

The servers, started here and alternated round by round (the order flips every round):

* this service: ``translate-serve`` with ``MODEL_DIR`` the bundle and ``CACHE_MB=0`` (no
  sentence cache), its default workers and threads;
* LibreTranslate, once per CTranslate2 layout in ``--lt-layouts`` (``INTERxINTRA``: Argos'
  ``ARGOS_INTER_THREADS`` replicas of ``ARGOS_INTRA_THREADS`` threads; the best of them is the
  comparison's), through ``bench/libretranslate_offline.py``: LibreTranslate's own server
  without its start-up download and with a rule in place of MiniSBD's downloaded sentence
  model. Its data, cache and config directories are under the work directory, never ``~``.

Both decode with beam 4 and length penalty 0.2 (Argos' fixed ``length_penalty=0.2`` and
``ARGOS_BEAM_SIZE=4``; this service gets ``beam_size``, ``length_penalty`` in every request),
stop at 256 target tokens (CTranslate2's default, which Argos keeps; this service gets
``max_length: 256`` and ``max_length_ratio: 16``), and no n-gram rule. This service still runs
its verbatim and place-name checks, as it does for every user.

The load: one aiohttp client (``bench/load.py``'s) posts, at each level, one-sentence requests
from 1, 8 and 64 concurrent clients and 16-sentence requests from 8 clients, every sentence
unseen by that server before (a round's sentences are the same for every server; rounds draw
new ones), as fast as answers come back; each API in its own shape (``/translate`` with
``text`` here, ``q`` there, a list for 16 sentences). Per server and level it prints lines/s,
p50/p99 latency over the rounds, the server's CPU seconds per 1,000 lines (user + system of
its processes, from ``/proc``), its resident memory after the level and the characters of
translation per line (the work done should match), then each server's peak resident memory
(``VmHWM``), and the ratios to the best LibreTranslate layout.

A script that prints figures for the machine it runs on; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.load import RunResult, Server, free_port, ratio, read_sentences  # noqa: E402

PAIR = ("en", "de")
LEVELS = ((1, 1), (8, 1), (64, 1), (8, 16))  # (clients, sentences a request)
DECODING = {"beam_size": 4, "length_penalty": 0.2, "max_length": 256, "max_length_ratio": 16}
_TICKS = os.sysconf("SC_CLK_TCK")


# -- the models ---------------------------------------------------------------------------------
def ct2_from_bundle(bundle: Path, work: Path, checkpoint: Path | None) -> Path:
    """CTranslate2 int8 of ``bundle``'s weights (via a recovered checkpoint)."""
    from bench.ctranslate2_convert import convert
    from training.recover import checkpoint_from_bundle

    out = work / "ct2"
    if not (out / "model.bin").is_file():
        if checkpoint is None:
            checkpoint = checkpoint_from_bundle(bundle, work / "recovered.pt")
        convert(checkpoint, out, quantization="int8")
    return out


def from_marian(marian: Path, work: Path, calibration: list[str]) -> tuple[Path, Path]:
    """(this service's int8 bundle, CTranslate2's int8 model) of a MarianMT directory."""
    from ctranslate2.converters import TransformersConverter

    from training.importers import import_model

    bundle, ct2 = work / "bundle", work / "ct2"
    if not (bundle / "manifest.json").is_file():
        # 64 sentences: a random-weight model decodes each to its length cap.
        sample = work / "calibration.txt"
        sample.write_text("\n".join(calibration[:64]) + "\n", encoding="utf-8")
        import_model(marian, bundle, int8=True, calibration=sample, default_variant="int8",
                     source_lang=PAIR[0], target_lang=PAIR[1])
    if not (ct2 / "model.bin").is_file():
        TransformersConverter(str(marian)).convert(str(ct2), quantization="int8", force=True)
    return bundle, ct2


def argos_package(bundle: Path, ct2: Path, tokenizer: Path, work: Path) -> Path:
    """``translate-en_de-1_0.argosmodel`` of the CTranslate2 model, its source format set as
    ``bundle``'s manifest records it."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    source = manifest.get("source_format", {})
    name = f"translate-{PAIR[0]}_{PAIR[1]}-1_0"
    package = work / "package" / name
    shutil.rmtree(package.parent, ignore_errors=True)
    shutil.copytree(ct2, package / "model")
    config_path = package / "model" / "config.json"
    config = json.loads(config_path.read_text())
    # Argos hands CTranslate2 bare pieces; the model expects the source framed as trained.
    config["add_source_bos"] = bool(source.get("add_bos", False))
    config["add_source_eos"] = bool(source.get("add_eos", True))
    config_path.write_text(json.dumps(config, indent=2))
    shutil.copy(tokenizer, package / "sentencepiece.model")
    (package / "metadata.json").write_text(json.dumps({
        "package_version": "1.0", "argos_version": "1.12", "type": "translate",
        "from_code": PAIR[0], "from_name": "English", "to_code": PAIR[1], "to_name": "German",
    }, indent=2))
    (package / "README.md").write_text(f"Built from {bundle} for bench/against_libretranslate.py\n")
    archive = work / f"{name}.argosmodel"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted(package.rglob("*")):
            zipped.write(path, path.relative_to(package.parent))
    return archive


def install(archive: Path, home: Path) -> None:
    """Unpack into LibreTranslate's package directory, as ``argospm install`` does."""
    packages = home / "packages"
    shutil.rmtree(packages, ignore_errors=True)
    packages.mkdir(parents=True)
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(packages)


# -- the servers --------------------------------------------------------------------------------
@dataclass
class Served:
    label: str
    server: Server
    libretranslate: bool
    cpu_s: dict[tuple[int, int], float] = field(default_factory=dict)
    rss_mib: dict[tuple[int, int], float] = field(default_factory=dict)
    runs: dict[tuple[int, int], list[RunResult]] = field(default_factory=dict)
    characters: dict[tuple[int, int], int] = field(default_factory=dict)  # of translations

    def body(self, texts: list[str]) -> tuple[str, dict]:
        text: str | list[str] = texts[0] if len(texts) == 1 else texts
        if self.libretranslate:
            return "/translate", {"q": text, "source": PAIR[0], "target": PAIR[1]}
        return "/translate", {
            "text": text, "source_lang": PAIR[0], "target_lang": PAIR[1], **DECODING,
        }

    def translated_characters(self, answer: dict) -> int:
        """Characters of the translations in ``answer``: the work both did should match."""
        if self.libretranslate:
            text = answer.get("translatedText", "")
            return len(text) if isinstance(text, str) else sum(map(len, text))
        return sum(len(t.get("text", "")) for t in answer.get("translations", []))


class LibreTranslateServer(Server):
    """LibreTranslate's server (``bench/libretranslate_offline.py``) from its virtualenv, with
    Argos' CTranslate2 layout ``inter`` x ``intra``; its files under ``home``."""

    ready_path = "/languages"  # no readiness route: the language list answers once it serves

    def __init__(self, venv: Path, home: Path, inter: int, intra: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            "ARGOS_PACKAGES_DIR": str(home / "packages"),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_CONFIG_HOME": str(home / "config"),
            # Never consulted (the index refresh is switched off); pointed nowhere regardless.
            "ARGOS_PACKAGE_INDEX": "file:///nonexistent/",
            "ARGOS_INTER_THREADS": str(inter),
            "ARGOS_INTRA_THREADS": str(intra),
            "ARGOS_BEAM_SIZE": str(DECODING["beam_size"]),
            "ARGOS_DEVICE_TYPE": "cpu",
            "ARGOS_COMPUTE_TYPE": "int8",
        }
        script = ROOT / "bench" / "libretranslate_offline.py"
        self.process = subprocess.Popen(
            [str(venv / "bin" / "python"), "-P", str(script), "--host", "127.0.0.1",
             "--port", str(self.port), "--load-only", ",".join(PAIR), "--disable-web-ui"],
            cwd=home, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
        )


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``'s processes."""
    total = 0
    for each in _tree(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS


def memory_mib(pid: int, key: str) -> float:
    """``VmRSS`` or ``VmHWM`` summed over ``pid``'s processes, MiB."""
    total = 0
    for each in _tree(pid):
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith(key + ":"):
                total += int(line.split()[1])
    return total / 1024


# -- the load -----------------------------------------------------------------------------------
async def drive(
    served: Served, clients: int, requests: list[list[str]]
) -> tuple[RunResult, int]:
    """The run's result and the characters of the translations it got back."""
    result = RunResult(served.label, clients)
    characters = 0
    work = list(reversed(requests))
    async with aiohttp.ClientSession(
        served.server.url, connector=aiohttp.TCPConnector(limit=clients),
        timeout=aiohttp.ClientTimeout(total=600),
    ) as client:

        async def worker() -> None:
            nonlocal characters
            while work:
                texts = work.pop()
                path, body = served.body(texts)
                started = time.perf_counter()
                try:
                    async with client.post(path, json=body) as response:
                        answer = await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    result.errors[type(exc).__name__] += 1
                    continue
                if response.status == 200:
                    result.latencies.append(time.perf_counter() - started)
                    result.sentences += len(texts)
                    characters += served.translated_characters(json.loads(answer))
                else:
                    result.errors[str(response.status)] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        result.seconds = time.perf_counter() - started
    return result, characters


def warm_up(served: Served, sentences: list[str]) -> None:
    """A few requests first: lazy loading (LibreTranslate loads its model on the first)."""
    asyncio.run(drive(served, 1, [[s] for s in sentences[:4]] + [sentences[4:20]]))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def merged(runs: list[RunResult]) -> RunResult:
    whole = RunResult(runs[0].label, runs[0].clients)
    for run in runs:
        whole.sentences += run.sentences
        whole.seconds += run.seconds
        whole.latencies += run.latencies
        whole.errors.update(run.errors)
    return whole


def _ms(value: float | None) -> str:
    return f"{value * 1000:,.0f}" if value is not None else "-"


def report(servers: list[Served]) -> None:
    print(f"\n{'server':<26} {'clients':>7} {'lines/req':>9} {'lines/s':>8} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'CPU s/1k':>8} {'RSS MiB':>8} {'chars/line':>10}  errors")
    for level in LEVELS:
        for served in servers:
            whole = merged(served.runs[level])
            errors = ", ".join(f"{k}: {v}" for k, v in sorted(whole.errors.items())) or "0"
            cpu = served.cpu_s[level] / whole.sentences * 1000 if whole.sentences else 0.0
            print(f"{served.label:<26} {level[0]:>7} {level[1]:>9} "
                  f"{whole.sentences_per_s:>8.1f} {_ms(whole.percentile(50)):>8} "
                  f"{_ms(whole.percentile(99)):>8} {cpu:>8.1f} "
                  f"{served.rss_mib[level]:>8.0f} "
                  f"{served.characters[level] / max(whole.sentences, 1):>10.1f}  {errors}")
    print()
    for served in servers:
        print(f"{served.label}: peak resident memory "
              f"{memory_mib(served.server.process.pid, 'VmHWM'):.0f} MiB")
    peers = [served for served in servers if served.libretranslate]
    for ours in (served for served in servers if not served.libretranslate):
        print()
        for level in LEVELS:
            best = max(peers, key=lambda s: merged(s.runs[level]).sentences_per_s)
            mine, theirs = merged(ours.runs[level]), merged(best.runs[level])
            print(f"{level[0]:>2} clients x {level[1]:>2} lines: best LibreTranslate "
                  f"{best.label}; {ours.label} / it: lines/s "
                  f"{ratio(mine.sentences_per_s, theirs.sentences_per_s)}"
                  f", p50 {ratio(mine.percentile(50), theirs.percentile(50))}"
                  f", p99 {ratio(mine.percentile(99), theirs.percentile(99))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lt-venv", type=Path,
                        default=Path(os.environ.get("LT_VENV", "/work/lt-venv")),
                        help="LibreTranslate's virtualenv (bench/libretranslate-venv.sh)")
    parser.add_argument("--bundle", type=Path, default=ROOT / "models" / "en-de")
    parser.add_argument("--checkpoint", type=Path,
                        help="the bundle's weights as a checkpoint (default: recovered here)")
    parser.add_argument("--marian", type=Path,
                        help="a MarianMT directory to compare on instead of --bundle")
    parser.add_argument("--test", type=Path, action="append",
                        help="TSV (source first) or one sentence a line; repeatable")
    parser.add_argument("--requests", type=int, default=200,
                        help="requests per server, level and round (16-line ones: a tenth)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lt-layouts", default="2x1,1x2,1x1",
                        help="CTranslate2 layouts INTERxINTRA LibreTranslate is run with")
    parser.add_argument("--work", type=Path, help="keep the built models here (reused)")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=DIR",
                        help="also serve this service from another checkout (a git worktree "
                        "of an earlier commit, say), in the same rounds; repeatable")
    args = parser.parse_args(argv)

    tests = args.test or [ROOT / "runs/en-de/data/test.tsv"]
    pool = list(dict.fromkeys(s for path in tests for s in read_sentences(path)))
    per_round = {(c, n): (args.requests if n == 1 else max(c, args.requests // 10)) * n
                 for c, n in LEVELS}
    needed = args.rounds * sum(per_round.values()) + 20
    if len(pool) < needed:
        parser.error(f"{needed} distinct sentences needed, {len(pool)} given: more --test "
                     "files, fewer --requests or --rounds")
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-lt-") as scratch:
        work = args.work or Path(scratch)
        if args.marian:
            bundle, ct2 = from_marian(args.marian, work, pool)
            tokenizer = args.marian / "source.spm"
        else:
            bundle = args.bundle
            ct2 = ct2_from_bundle(bundle, work, args.checkpoint)
            tokenizer = bundle / json.loads((bundle / "manifest.json").read_text())["tokenizer"]
        archive = argos_package(bundle, ct2, tokenizer, work)
        home = work / "libretranslate"
        install(archive, home)
        print(f"{cpu_model()}, {os.cpu_count()} logical CPUs; load average "
              f"{os.getloadavg()[0]:.2f} before the run")
        print(f"model {args.marian or bundle}; Argos package {archive}")
        print(f"{len(pool)} distinct sentences, {args.rounds} rounds; per round and server: "
              + ", ".join(f"{n // m} requests of {m} line(s) at {c} clients"
                          for (c, m), n in per_round.items()))
        return _run(args, bundle, home, pool, per_round)


def _run(args: argparse.Namespace, bundle: Path, home: Path, pool: list[str],
         per_round: dict[tuple[int, int], int]) -> int:
    ours = {"MODEL_DIR": str(bundle), "CACHE_MB": "0"}
    servers = [Served("this service", Server(ours), libretranslate=False)]
    for also in args.also:
        label, _, checkout = also.partition("=")
        servers.append(Served(label, Server(ours, checkout=Path(checkout).resolve()),
                              libretranslate=False))
    for layout in args.lt_layouts.split(","):
        inter, intra = (int(n) for n in layout.lower().split("x"))
        servers.append(Served(f"LibreTranslate {inter}x{intra}",
                              LibreTranslateServer(args.lt_venv, home, inter, intra),
                              libretranslate=True))
    try:
        for served in servers:
            served.server.wait_ready()
            warm_up(served, pool)
        position = 20
        for round_ in range(args.rounds):
            for level in LEVELS:
                clients, lines = level
                chunk = pool[position : position + per_round[level]]
                position += per_round[level]
                requests = [chunk[i : i + lines] for i in range(0, len(chunk), lines)]
                order = servers if round_ % 2 == 0 else servers[::-1]
                for served in order:
                    pid = served.server.process.pid
                    before = cpu_seconds(pid)
                    result, characters = asyncio.run(drive(served, clients, requests))
                    served.characters[level] = served.characters.get(level, 0) + characters
                    served.cpu_s[level] = served.cpu_s.get(level, 0.0) + cpu_seconds(pid) - before
                    served.rss_mib[level] = memory_mib(pid, "VmRSS")
                    served.runs.setdefault(level, []).append(result)
                    print(f"round {round_ + 1} {served.label:<26} {clients:>2} clients x "
                          f"{lines:>2} lines: {result.sentences_per_s:6.1f} lines/s, p50 "
                          f"{_ms(result.percentile(50))} ms", flush=True)
        report(servers)
    finally:
        for served in servers:
            served.server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
