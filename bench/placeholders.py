"""Placeholders through the real model, with and without ``service.placeholders``.

    python bench/placeholders.py [--bundle models/en-de] [--limit 300] [--threads 1]
        [--markers "{%d}"] [TSV ...]

Takes the rows of the TSVs (default: the gettext held-out split, test then dev) whose source
holds a printf or brace placeholder, at most ``--limit`` distinct sources, and translates
them plainly and protected (``protect`` -> model -> ``restore``) with each marker form of
``--markers`` (comma-separated). Prints, for each way:

* placeholders intact: the share of outputs holding every printf/brace placeholder of the
  source exactly as often as the source does;
* all items intact: the same over every item ``protect`` masks (also URLs, e-mail
  addresses, numbers, emoji);
* for the protected runs, the share of items the model placed itself against those put back
  by rule, and the share of outputs where the model placed every item.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from pathlib import Path

import regex

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.engine import Engine
from service.placeholders import _BRACE, _PRINTF, MARKER, protect

PLACEHOLDER = regex.compile(f"(?:{_PRINTF})|(?:{_BRACE})")
DEFAULT_DATA = ["/work/main/runs/en-de/data/test.tsv", "/work/main/runs/en-de/data/dev.tsv"]


def sources(paths: list[str], limit: int) -> list[str]:
    chosen: dict[str, None] = {}
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            source = line.split("\t", 1)[0]
            if PLACEHOLDER.search(source):
                chosen[source] = None
            if len(chosen) >= limit:
                return list(chosen)
    return list(chosen)


def occurrences(item: str, text: str) -> int:
    """How often ``item`` stands in ``text`` (a number inside a longer one does not count)."""
    before = r"(?<!\d)" if item[0].isdigit() else ""
    after = r"(?!\d)" if item[-1].isdigit() else ""
    return len(regex.findall(before + regex.escape(item) + after, text))


def intact(source: str, items: list[str], output: str) -> bool:
    """Every item of the source in ``output`` exactly as often as in the source."""
    return all(occurrences(item, output) == occurrences(item, source) for item in set(items))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def head_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "unknown"
    except OSError:  # no git (a container)
        return "unknown"


def held_out_arguments(doc: str) -> argparse.ArgumentParser:
    """The options of a run of the real model over the held-out split."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("tsv", nargs="*", default=DEFAULT_DATA)
    parser.add_argument("--bundle", default="models/en-de")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    return parser


def main() -> None:
    parser = held_out_arguments(__doc__)
    parser.add_argument("--markers", default=MARKER, help="comma-separated marker forms")
    args = parser.parse_args()

    texts = sources(args.tsv, args.limit)
    engine = Engine(args.bundle, threads=args.threads)
    print(f"{len(texts)} sources with placeholders; {args.bundle}, {cpu_model()}, "
          f"threads={args.threads}, commit {head_commit()}")
    placeholders = [PLACEHOLDER.findall(t) for t in texts]
    items = [list(protect(t).items) for t in texts]

    def report(name: str, outputs: list[str], seconds: float) -> None:
        kept = sum(map(intact, texts, placeholders, outputs)) / len(texts)
        kept_all = sum(map(intact, texts, items, outputs)) / len(texts)
        print(f"{name:<22} placeholders intact {kept:7.1%}   all items intact {kept_all:7.1%}"
              f"   {seconds:6.1f} s")

    start = time.perf_counter()
    plain = [t.text for t in engine.translate(texts)]
    report("plain", plain, time.perf_counter() - start)

    for marker in args.markers.split(","):
        start = time.perf_counter()
        protected = [protect(t, marker) for t in texts]
        masked = [t.text for t in engine.translate([p.text for p in protected])]
        restored = [p.restore(m) for p, m in zip(protected, masked, strict=True)]
        report(f"protected {marker!r}", [r.text for r in restored], time.perf_counter() - start)
        by_model = sum(len(r.by_model) for r in restored)
        by_rule = sum(len(r.by_rule) for r in restored)
        whole = sum(not r.by_rule for r in restored) / len(texts)
        removed = sum(r.removed for r in restored)
        print(f"{'':<22} items placed by the model {by_model / (by_model + by_rule):6.1%}, "
              f"restored by rule {by_rule / (by_model + by_rule):6.1%} "
              f"({by_model + by_rule} items); outputs placed wholly by the model {whole:6.1%}; "
              f"surplus markers removed {removed}")


if __name__ == "__main__":
    main()
