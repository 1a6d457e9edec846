"""Compare SentencePiece vocabularies of different sizes on a prepared train split, by what the
size costs and buys before any model is trained:

    python scripts/vocab-sizes.py runs/en-de/data/train.tsv configs/en-de.toml \\
        runs/vocab-size/spm4k.model models/en-de/sentencepiece.model runs/vocab-size/spm16k.model

For each vocabulary, on the target side (what the decoder predicts, one softmax class a piece)
and the source side:

* pieces per sentence: decoder steps per translation, and the sequence length attention sees;
* the share of the vocabulary's pieces seen at least 100 times in train, on the target side
  and on either (the vocabulary is joint, so every piece is a class of the decoder's softmax).
  Gowda and May (2020, "Finding the Optimal Vocabulary Size for Neural Machine Translation")
  advise the largest vocabulary in which at least 95% of the classes have 100 or more training
  examples, since rarer classes are learned badly. Byte-fallback pieces (256, rare by design)
  and the special pieces are left out of these shares;
* the decoder's multiply-accumulates per translated sentence for the config's model shape
  (projections and feed-forward per layer, plus the output projection over the vocabulary, times
  pieces per sentence; attention over the cache left out, which grows with length), relative to
  the first vocabulary: what the size costs at serving time.

train.tsv holds the weighted mix (a source at x2 appears twice), so counts are what training
sees in one pass.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.config import load_config  # noqa: E402
from training.corpus import read_tsv  # noqa: E402

ENOUGH = 100  # Gowda and May's threshold of training examples per class


def decoder_macs_per_step(d_model: int, d_ff: int, layers: int, vocab: int) -> int:
    """Multiply-accumulates of one decoder step without attention over the caches: per layer
    the self-attention's Q/K/V and output projections, cross-attention's query and output, the
    feed-forward pair; then the output projection onto the vocabulary."""
    per_layer = 4 * d_model * d_model + 2 * d_model * d_model + 2 * d_model * d_ff
    return layers * per_layer + d_model * vocab


def side_counts(processor: spm.SentencePieceProcessor, lines: list[str]) -> tuple[Counter, float]:
    """How often each piece occurs in ``lines``, and the pieces per line (end of sentence
    included)."""
    counts: Counter[int] = Counter()
    pieces = 0
    for ids in processor.encode(lines):
        counts.update(ids)
        pieces += len(ids) + 1
    return counts, pieces / len(lines)


def share(counts: Counter, pieces: list[int], test) -> float:
    return sum(1 for piece in pieces if test(counts[piece])) / len(pieces)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("train_tsv")
    parser.add_argument("config", help="the model shape to cost (its [model] section)")
    parser.add_argument("models", nargs="+", help="SentencePiece models, the first the baseline")
    parser.add_argument("--limit", type=int, default=0, help="only the first N lines of train")
    args = parser.parse_args()
    model = load_config(args.config).model
    pairs = read_tsv(args.train_tsv)[: args.limit or None]
    sources, targets = [source for source, _ in pairs], [target for _, target in pairs]
    print(f"{len(targets):,} pairs of {args.train_tsv}; decoder {model.decoder_layers} layers, "
          f"d_model {model.d_model}, d_ff {model.d_ff}")
    print(f"| vocabulary | pieces | target pieces / sentence | source pieces / sentence "
          f"| pieces seen >= {ENOUGH}x (target / either side) | never seen on the target side "
          f"| decoder work / sentence |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    baseline = None
    for path in args.models:
        processor = spm.SentencePieceProcessor(model_file=path)
        size = processor.get_piece_size()
        # The learned pieces: byte fallback (256 ids, rare by design) and specials left out.
        learned = [piece for piece in range(size) if not (
            processor.is_byte(piece) or processor.is_control(piece) or processor.is_unknown(piece))]
        target, target_length = side_counts(processor, targets)
        source, source_length = side_counts(processor, sources)
        work = target_length * decoder_macs_per_step(
            model.d_model, model.d_ff, model.decoder_layers, size)
        baseline = baseline or work
        enough = (share(target, learned, lambda n: n >= ENOUGH),
                  share(target + source, learned, lambda n: n >= ENOUGH))
        print(f"| {path} | {size:,} | {target_length:.2f} | {source_length:.2f} "
              f"| {100 * enough[0]:.1f}% / {100 * enough[1]:.1f}% "
              f"| {100 * share(target, learned, lambda n: n == 0):.1f}% | {work / baseline:.2f}x |")


if __name__ == "__main__":
    main()
