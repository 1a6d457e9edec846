"""Inline tags through the real model, with and without ``service.markup``.

    python bench/markup.py [--bundle models/en-de] [--limit 300] [--threads 1] [TSV ...]

The held-out split holds almost no HTML, so each of the first ``--limit`` distinct sources of
four words or more (default: the gettext held-out split, test then dev) gets one inline
element around a span of one to three words, the element and span drawn with a fixed seed
(``<b>``, ``<i>``, ``<em>``, ``<a href="https://example.com/?a=1&amp;b=2">``), inside a
``<p>``. Prints, translating the HTML as plain text and through ``markup.parse`` /
``Document.restore``:

* tags intact: the share of outputs whose tags are the source's, in the same order, with
  the same attributes;
* intact and wrapping text: of those, the share whose inline element still wraps some text
  (not ``<b></b>``);
* for markup, the share of inline tags the model placed in order against those put back by
  rule.
"""

from __future__ import annotations

import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.placeholders import cpu_model, head_commit, held_out_arguments
from service.engine import Engine
from service.markup import parse

ELEMENTS = [("<b>", "</b>"), ("<i>", "</i>"), ("<em>", "</em>"),
            ('<a href="https://example.com/?a=1&amp;b=2">', "</a>")]
TAGS = re.compile(r"<[^<>]*>")
EMPTY = re.compile(r"<(\w+)[^<>]*>\s*</\1>")


def fragments(paths: list[str], limit: int, seed: int = 19) -> list[str]:
    rng = random.Random(seed)
    chosen: dict[str, None] = {}
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            source = line.split("\t", 1)[0]
            words = source.split(" ")
            if len(words) < 4 or "<" in source or "&" in source:
                continue
            size = rng.randint(1, 3)
            start = rng.randrange(0, len(words) - size + 1)
            opening, closing = rng.choice(ELEMENTS)
            words[start] = opening + words[start]
            words[start + size - 1] += closing
            chosen[f"<p>{' '.join(words)}</p>"] = None
            if len(chosen) >= limit:
                return list(chosen)
    return list(chosen)


def main() -> None:
    args = held_out_arguments(__doc__).parse_args()

    sources = fragments(args.tsv, args.limit)
    engine = Engine(args.bundle, threads=args.threads)
    print(f"{len(sources)} fragments; {args.bundle}, {cpu_model()}, threads={args.threads}, "
          f"commit {head_commit()}")

    def report(name: str, outputs: list[str], seconds: float) -> None:
        kept = [TAGS.findall(o) == TAGS.findall(s) for s, o in zip(sources, outputs, strict=True)]
        wrapped = sum(k and not EMPTY.search(o) for k, o in zip(kept, outputs, strict=True))
        print(f"{name:<8} tags intact {sum(kept) / len(sources):7.1%}   intact and wrapping text "
              f"{wrapped / len(sources):7.1%}   {seconds:6.1f} s")

    start = time.perf_counter()
    plain = [t.text for t in engine.translate(sources)]
    report("plain", plain, time.perf_counter() - start)

    start = time.perf_counter()
    documents = [parse(s) for s in sources]
    segments = [segment for d in documents for segment in d.segments]
    translated = iter(t.text for t in engine.translate(segments))
    rendered = [d.restore([next(translated) for _ in d.segments]) for d in documents]
    report("markup", [r.text for r in rendered], time.perf_counter() - start)
    by_model = sum(r.by_model for r in rendered)
    by_rule = sum(r.by_rule for r in rendered)
    print(f"{'':<8} inline tags placed by the model {by_model / (by_model + by_rule):6.1%}, "
          f"put back by rule {by_rule / (by_model + by_rule):6.1%} ({by_model + by_rule} tags)")


if __name__ == "__main__":
    main()
