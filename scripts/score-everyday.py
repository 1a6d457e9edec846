"""Score bundles on everyday sentences (``configs/probes/everyday-en-de.tsv``: 210 written for
this project, 30 in each of travel, home, shopping, health, work, weather, time and dates),
translated as the service answers them:

    python scripts/score-everyday.py models/en-de [runs/NEW-BUNDLE ...] [--outputs FILE.tsv]

Prints a Markdown table, one row per category and one column per bundle: BLEU and chrF of the
category as a corpus (sacrebleu's defaults), the outputs identical to the reference ("exact":
after collapsing runs of whitespace; case and punctuation count) and those close to it
("close": sentence chrF >= 80, exact ones included). Close is not "right": chrF is a surface
measure that passes "gerne" for "gern" or a dropped full stop, but also a dropped word or a wrong
verb ("Der Supermarkt schließt acht.", "Ich möchte diese Jacke zurückkehren."), and fails a
synonym ("Reise" for "Fahrt") as it fails a wrong word; of the 13 close outputs of the model at
step 59,641 that were not exact, 5 read as acceptable German. Per category, 30 short sentences make
BLEU move by several points for one changed word: read the categories as pointers and compare
bundles on "all". With two or more bundles, sacrebleu's paired bootstrap compares each with the
first (by its design, even a zero difference gets its smallest p).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.translator import Translator  # noqa: E402

SENTENCES = ROOT / "configs" / "probes" / "everyday-en-de.tsv"
CLOSE_CHRF = 80.0


@dataclass(frozen=True)
class Sentence:
    category: str
    source: str
    reference: str


@dataclass(frozen=True)
class Scores:
    count: int
    bleu: float
    chrf: float
    exact: int
    close: int

    def cell(self) -> str:
        return f"{self.bleu:.1f} / {self.chrf:.1f} / {self.exact} / {self.close}"


def read_sentences(path: Path = SENTENCES) -> list[Sentence]:
    with path.open(encoding="utf-8") as file:
        rows = csv.DictReader((line for line in file if not line.startswith("#")),
                              delimiter="\t", quoting=csv.QUOTE_NONE)
        return [Sentence(row["category"], row["english"], row["german"]) for row in rows]


def _normalised(text: str) -> str:
    return " ".join(text.split())


def score(outputs: list[str], references: list[str], close: float = CLOSE_CHRF) -> Scores:
    exact = sum(_normalised(out) == _normalised(ref)
                for out, ref in zip(outputs, references, strict=True))
    near = sum(sacrebleu.sentence_chrf(out, [ref]).score >= close
               for out, ref in zip(outputs, references, strict=True))
    return Scores(len(outputs), sacrebleu.corpus_bleu(outputs, [references]).score,
                  sacrebleu.corpus_chrf(outputs, [references]).score, exact, near)


def translate(bundle: str, sources: list[str], threads: int) -> list[str]:
    # The service's defaults (DEFAULT_BEAM, the bundle's decoding, its second passes for
    # numbers, place names and verbatim items); no cache, so each bundle is measured afresh.
    with Translator.open(bundle, threads=threads, workers=1, cache_mb=0) as translator:
        return [result.text for result in translator.translate_batch(sources)]


def write_outputs(path: Path, sentences: list[Sentence], bundles: list[str],
                  outputs: list[list[str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as file:
        writer = csv.writer(file, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\",
                            lineterminator="\n")
        names = [f"{name} {column}" for name in bundles for column in ("output", "chrF")]
        writer.writerow(["category", "english", "german", *names])
        for index, sentence in enumerate(sentences):
            cells: list[str] = []
            for column in outputs:
                chrf = sacrebleu.sentence_chrf(column[index], [sentence.reference]).score
                cells += [column[index], f"{chrf:.1f}"]
            writer.writerow([sentence.category, sentence.source, sentence.reference, *cells])


def compare(bundles: list[str], outputs: list[list[str]], references: list[str],
            samples: int) -> list[str]:
    """Each bundle against the first, paired bootstrap over the sentences: on 210 short
    sentences one or two points of BLEU are within the noise, and this says how far."""
    test = PairedTest(named_systems=list(zip(bundles, outputs, strict=True)),
                      metrics={"BLEU": BLEU(), "chrF": CHRF()}, references=[references],
                      test_type="bs", n_samples=samples)
    _, results = test()
    lines = []
    for index, bundle in enumerate(bundles[1:], start=1):
        parts = []
        # Keyed by sacrebleu's names for the metrics ("BLEU", "chrF2"), after the system names.
        for metric in (name for name in results if name != "System"):
            base, other = results[metric][0], results[metric][index]
            parts.append(f"{metric} {other.score - base.score:+.2f} (p = {other.p_value:.3f})")
        lines.append(f"{bundle} against {bundles[0]}: " + ", ".join(parts))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", help="bundle directories, one column each")
    parser.add_argument("--sentences", type=Path, default=SENTENCES)
    parser.add_argument("--outputs", type=Path,
                        help="write each sentence, its reference, and each bundle's output "
                             "and sentence chrF to this TSV")
    parser.add_argument("--close", type=float, default=CLOSE_CHRF,
                        help="sentence chrF at or above which an output counts as close")
    parser.add_argument("--bootstrap", type=int, default=1000,
                        help="resamples for the paired comparison (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    sentences = read_sentences(args.sentences)
    categories = list(dict.fromkeys(sentence.category for sentence in sentences))
    outputs = []
    for bundle in args.bundles:
        start = time.perf_counter()
        outputs.append(translate(bundle, [sentence.source for sentence in sentences],
                                 args.threads))
        print(f"{bundle}: {len(sentences)} sentences in {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
    print("| category | " + " | ".join(args.bundles) + " |")
    print("|---" + "|---:" * len(args.bundles) + "|")
    for category in [*categories, "all"]:
        chosen = [index for index, sentence in enumerate(sentences)
                  if category in (sentence.category, "all")]
        references = [sentences[index].reference for index in chosen]
        cells = [score([column[index] for index in chosen], references, args.close).cell()
                 for column in outputs]
        name = f"**{category}**" if category == "all" else category
        print(f"| {name} ({len(chosen)}) | " + " | ".join(cells) + " |")
    print(f"\nBLEU / chrF / exact / close (sentence chrF >= {args.close:g}), "
          f"as the service answers ({args.sentences.name}).")
    if len(args.bundles) > 1 and args.bootstrap > 0:
        references = [sentence.reference for sentence in sentences]
        for line in compare(args.bundles, outputs, references, args.bootstrap):
            print(line)
    if args.outputs:
        write_outputs(args.outputs, sentences, args.bundles, outputs)


if __name__ == "__main__":
    main()
