"""Glossaries on held-out sentences: how often the glossary's terms come out as given, and what
they do to BLEU, against the same sentences without the glossary.

The glossary is derived here, not written by hand: English words and German words that occur
in the same training pairs far more often than apart (Dice coefficient over the first
``--train-pairs`` pairs of the training split) are taken as translations; a held-out sentence
joins the test set when its source holds such a word and its reference holds the German
word. The glossary then asks for the reference's own term. Prints the term rate (target term
present in the translation) and BLEU/chrF with and without, through the Python API; never
asserts.

    python bench/glossary.py                                  # models/en-de, runs/en-de/data
    python bench/glossary.py --sentences 300 --min-dice 0.6
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.placeholders import cpu_model, head_commit  # noqa: E402

WORD = re.compile(r"[^\W\d_]{4,}")


def words(text: str) -> set[str]:
    return set(WORD.findall(text))


def dictionary(train: Path, pairs: int, min_count: int, min_dice: float) -> dict[str, str]:
    """{English word (lower case): German word as it is written most often}."""
    source_count: collections.Counter[str] = collections.Counter()
    target_count: collections.Counter[str] = collections.Counter()
    together: collections.Counter[tuple[str, str]] = collections.Counter()
    with train.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines):
            if number == pairs:
                break
            source, _, target = line.rstrip("\n").partition("\t")
            english = {w.lower() for w in words(source)}
            german = words(target)
            source_count.update(english)
            target_count.update(german)
            if len(english) * len(german) <= 400:  # long pairs pair everything with everything
                together.update((e, g) for e in english for g in german)
    best: dict[str, tuple[float, str]] = {}
    for (english, german), count in together.items():
        if count < min_count or english == german.lower():  # names the model copies anyway
            continue
        dice = 2 * count / (source_count[english] + target_count[german])
        if dice >= min_dice and dice > best.get(english, (0.0, ""))[0]:
            best[english] = (dice, german)
    return {english: german for english, (_, german) in best.items()}


def test_set(held_out: Path, terms: dict[str, str], count: int,
             ) -> list[tuple[str, str, dict[str, str]]]:
    """(source, reference, glossary entries) for sentences whose source has a term and whose
    reference has its German word."""
    chosen = []
    for line in held_out.read_text(encoding="utf-8").splitlines():
        source, _, reference = line.partition("\t")
        present = words(reference)
        entries = {w: terms[w.lower()] for w in words(source)
                   if w.lower() in terms and terms[w.lower()] in present}
        if entries:
            chosen.append((source, reference, entries))
        if len(chosen) == count:
            break
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=str(ROOT / "models/en-de"))
    parser.add_argument("--data", type=Path, default=ROOT / "runs/en-de/data")
    parser.add_argument("--train-pairs", type=int, default=200_000)
    parser.add_argument("--min-count", type=int, default=20)
    parser.add_argument("--min-dice", type=float, default=0.5)
    parser.add_argument("--sentences", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import sacrebleu

    from service.glossary import Terms
    from service.translator import Translator

    started = time.monotonic()
    terms = dictionary(args.data / "train.tsv", args.train_pairs, args.min_count, args.min_dice)
    cases = test_set(args.data / "test.tsv", terms, args.sentences)
    sources = [source for source, _, _ in cases]
    references = [reference for _, reference, _ in cases]
    with Translator.open(args.model_dir, threads=args.threads, workers=1) as translator:
        plain = [r.text for r in translator.translate_batch(sources)]
        with_glossary = []
        for source, _, entries in cases:  # one glossary a sentence: its own terms
            result = translator.translate_batch([source], glossary=Terms(entries))
            with_glossary.append(result[0].text)
    total = sum(len(entries) for _, _, entries in cases)

    def rate(outputs: list[str]) -> float:
        kept = sum(target in words(output) for output, (_, _, entries) in zip(
            outputs, cases, strict=True) for target in entries.values())
        return 100 * kept / total

    print(f"# bench/glossary.py  commit {head_commit()}  CPU: {cpu_model()}  model: "
          f"{Path(args.model_dir).name}  {len(terms)} dictionary terms from "
          f"{args.train_pairs} training pairs; {len(cases)} held-out sentences with "
          f"{total} glossary terms ({time.monotonic() - started:.0f} s)")
    print("| | terms as given | BLEU | chrF |")
    print("|---|---:|---:|---:|")
    for label, outputs in (("without glossary", plain), ("with glossary", with_glossary)):
        bleu = sacrebleu.corpus_bleu(outputs, [references]).score
        chrf = sacrebleu.corpus_chrf(outputs, [references]).score
        print(f"| {label} | {rate(outputs):.1f}% | {bleu:.2f} | {chrf:.2f} |")
    for (source, _, entries), before, after in list(zip(cases, plain, with_glossary,
                                                        strict=True))[:5]:
        print(f"\n  {source}\n  glossary {entries}\n  without: {before}\n  with:    {after}")


if __name__ == "__main__":
    main()
