"""Score bundles on the probes of their recurring errors (``configs/probes/en-de.tsv``: numbers
written as words, exonyms, articles and gender, everyday senses of software words), translated
as the service translates them:

    python scripts/probes.py models/en-de runs/NEW-BUNDLE [--show]

A probe passes when every required term appears in the translation (as a whole word, any case;
``a|b`` accepts either) and no forbidden one does. Prints, per class and bundle, the probes
passed and chrF against the references; ``--show`` adds each failing translation.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import regex
import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.translator import Translator  # noqa: E402

PROBES = ROOT / "configs" / "probes" / "en-de.tsv"


@dataclass(frozen=True)
class Probe:
    kind: str
    source: str
    reference: str
    required: tuple[str, ...]  # each "a|b": one of the alternatives must appear
    forbidden: tuple[str, ...]

    def passes(self, translation: str) -> bool:
        return (all(any(_has(translation, term) for term in need.split("|"))
                    for need in self.required)
                and not any(_has(translation, term) for term in self.forbidden))


def _has(text: str, term: str) -> bool:
    return regex.search(rf"(?<!\w){regex.escape(term)}(?!\w)", text, regex.IGNORECASE) is not None


def _terms(cell: str | None) -> tuple[str, ...]:
    return tuple(term.strip() for term in (cell or "").split(";") if term.strip())


def read_probes(path: Path = PROBES) -> list[Probe]:
    with path.open(encoding="utf-8") as file:
        rows = csv.DictReader((line for line in file if not line.startswith("#")),
                              delimiter="\t", quoting=csv.QUOTE_NONE)
        return [Probe(row["class"], row["source"], row["reference"], _terms(row["required"]),
                      _terms(row.get("forbidden"))) for row in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", help="bundle directories, one column each")
    parser.add_argument("--probes", type=Path, default=PROBES)
    parser.add_argument("--show", action="store_true", help="print each failing translation")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    probes = read_probes(args.probes)
    kinds = list(dict.fromkeys(probe.kind for probe in probes))
    table: dict[str, list[str]] = defaultdict(list)
    for bundle in args.bundles:
        # The service's defaults (DEFAULT_BEAM, the bundle's decoding); no cache needed.
        with Translator.open(bundle, threads=args.threads, workers=1, cache_mb=0) as translator:
            outputs = [r.text for r in translator.translate_batch([p.source for p in probes])]
        for kind in [*kinds, "all"]:
            chosen = [(p, out) for p, out in zip(probes, outputs, strict=True)
                      if kind in (p.kind, "all")]
            passed = sum(p.passes(out) for p, out in chosen)
            chrf = sacrebleu.corpus_chrf([out for _, out in chosen],
                                         [[p.reference for p, _ in chosen]]).score
            table[kind].append(f"{passed}/{len(chosen)} ({chrf:.1f})")
            if args.show and kind != "all":
                for probe, out in chosen:
                    if not probe.passes(out):
                        print(f"[{bundle}] {kind}: {probe.source} -> {out}")
    print("| class | " + " | ".join(args.bundles) + " |")
    print("|---" * (len(args.bundles) + 1) + "|")
    for kind, cells in table.items():
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print("\nProbes passed (chrF against the references).")


if __name__ == "__main__":
    main()
