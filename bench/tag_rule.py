"""How well ``service.markup`` puts back inline tags the model dropped, measured against the
model's own placement.

    python bench/tag_rule.py [--bundle models/en-de] [--limit 300] [--threads 1] [TSV ...]

Fragments as ``bench/markup.py`` makes them (one inline element around one to three words of
a held-out sentence). Of the outputs whose tags the model placed itself (none put back by
rule), the tags are taken out of the model's translation and put back by rule; prints how
often the rule wraps exactly the words the model wrapped, and the words' Jaccard overlap on
average. Prints figures; never asserts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.markup import fragments
from bench.placeholders import cpu_model, head_commit, held_out_arguments
from service.engine import Engine
from service.markup import parse

TAG = re.compile(r"<[^<>]*>")
WRAPPED = re.compile(r"<(b|i|em|a)\b[^>]*>(.*?)</\1>")


def wrapped(html: str) -> list[str] | None:
    found = WRAPPED.search(html)
    return found.group(2).split() if found else None


def main() -> None:
    args = held_out_arguments(__doc__).parse_args()
    sources = fragments(args.tsv, args.limit)
    engine = Engine(args.bundle, threads=args.threads)
    segments = [parse(source).segments[0] for source in sources]
    outputs = [result.text for result in engine.translate(segments)]
    same = overlap = count = 0
    for source, output in zip(sources, outputs, strict=True):
        rendered = parse(source).restore([output])
        reference = wrapped(rendered.text)
        if rendered.by_rule or not reference:
            continue  # only where the model placed every tag itself
        stripped = re.sub(r"  +", " ", TAG.sub("", output))
        got = wrapped(parse(source).render([stripped])) or []
        count += 1
        same += got == reference
        union = set(got) | set(reference)
        overlap += len(set(got) & set(reference)) / len(union) if union else 1.0
    print(f"{len(sources)} fragments; {args.bundle}, {cpu_model()}, commit {head_commit()}")
    print(f"{count} whose tags the model placed; with its tags taken out, the rule wraps the "
          f"same words in {same / count:.1%}, word Jaccard {overlap / count:.3f}")


if __name__ == "__main__":
    main()
