"""A joint English-German SentencePiece vocabulary with fixed special ids."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from training.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, VocabConfig
from training.verbatim import WORD, is_name

logger = logging.getLogger(__name__)

# Every byte gets a piece so that no input is ever <unk>; together with the four specials these
# come out of the vocabulary budget before any learned piece does.
_BYTE_PIECES = 256
_SPECIALS = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
_SEED = 1234  # only matters when the corpus exceeds input_sentence_size and is sampled


def _both_sides(train_tsv: Path) -> Iterator[str]:
    # One side after the other of each pair, streamed: a joint vocabulary lets the many
    # identical strings (names, placeholders, numbers, markup) share pieces across languages,
    # and the training split is never held in memory twice.
    with open(train_tsv, encoding="utf-8", newline="\n") as f:
        for line in f:
            src, sep, tgt = line.rstrip("\n").partition("\t")
            if src:
                yield src
            if sep and tgt:
                yield tgt


def train_vocab(train_tsv: str | Path, config: VocabConfig) -> Path:
    """Train the vocabulary on both sides of ``train_tsv``; return ``{model_prefix}.model``."""
    train_tsv = Path(train_tsv)
    if not train_tsv.is_file():
        raise FileNotFoundError(f"training split not found: {train_tsv}")
    minimum = _BYTE_PIECES + len(_SPECIALS) + 1
    if config.size < minimum:
        raise ValueError(
            f"vocab.size={config.size} is too small: byte fallback and the special tokens alone "
            f"take {minimum - 1} ids"
        )
    if config.model_type not in ("unigram", "bpe"):
        raise ValueError(f"vocab.model_type must be 'unigram' or 'bpe', got {config.model_type!r}")
    prefix = Path(config.model_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(_SEED)
    spm.SentencePieceTrainer.train(
        sentence_iterator=_both_sides(train_tsv),
        model_prefix=str(prefix),
        vocab_size=config.size,
        model_type=config.model_type,
        character_coverage=config.character_coverage,
        input_sentence_size=config.input_sentence_size,
        shuffle_input_sentence=True,
        byte_fallback=True,
        # No normalisation inside SentencePiece: the corpus is already NFC, control-free and
        # whitespace-folded by training.corpus.clean_text (which serving must also apply), and
        # NFKC ("nfkc"/"nmt_nfkc") would rewrite text the model has to reproduce: "…" becomes
        # "...", "²" becomes "2", "ﬁ" becomes "fi", so decode(encode(x)) != x and German UI
        # strings lose their typography. Identity keeps the round trip exact.
        normalization_rule_name="identity",
        remove_extra_whitespaces=True,
        # Numbers are copied rather than translated; one piece per digit stops the vocabulary
        # from spending thousands of entries on years, versions and verse numbers.
        split_digits=config.split_digits,
        required_chars=config.required_chars,
        user_defined_symbols=config.user_defined_symbols,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_piece="<pad>",
        unk_piece="<unk>",
        bos_piece="<s>",
        eos_piece="</s>",
        num_threads=2,
        minloglevel=2,  # SentencePiece is very chatty on stderr; errors still come through
    )
    model = prefix.with_name(prefix.name + ".model")
    load_vocab(model)  # fail here, not at training time, if the ids somehow did not stick
    logger.info("vocabulary written to %s", model)
    return model


def load_vocab(path: str | Path) -> spm.SentencePieceProcessor:
    """Load a SentencePiece model, refusing one whose special ids differ from the fixed ones
    (the model's embedding rows and the decoder's stop condition depend on them)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    actual = {"pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id()}
    wrong = [f"{name}={actual[name]} (expected {want})" for name, want in _SPECIALS.items()
             if actual[name] != want]
    if wrong:
        raise ValueError(f"{path}: special token ids do not match training.config: "
                         f"{', '.join(wrong)}; retrain the vocabulary with train_vocab")
    return sp


def vocab_coverage(sp: spm.SentencePieceProcessor, texts: Iterable[str]) -> dict[str, Any]:
    """How a vocabulary covers what translations copy, over ``texts``:

    - ``byte_fallback_chars``: characters encoded as raw bytes (2-4 pieces each, the model must
      spell them byte by byte), per 10,000 characters, and the commonest of them;
    - ``digits_as_digit_pieces``: the share of digits that are a piece of their own (a lone
      digit, or one after the word-start mark), which is what ``split_digits`` promises;
    - ``pieces_per_name`` / ``pieces_per_word``: mean pieces of capitalised words (as
      ``training.verbatim`` finds names) and of the other words, each encoded alone.
    """
    chars = digits = digit_pieces = 0
    fallback: Counter[str] = Counter()
    name_pieces, word_pieces = [], []
    for text in texts:
        chars += len(text)
        digits += sum(ch.isdigit() for ch in text)
        run = bytearray()
        for piece_id in [*sp.encode(text), None]:
            if piece_id is not None and sp.is_byte(piece_id):
                run.append(int(sp.id_to_piece(piece_id)[3:5], 16))
                continue
            if run:
                fallback.update(run.decode("utf-8", errors="replace"))
                run.clear()
            if piece_id is not None:
                piece = sp.id_to_piece(piece_id).removeprefix("▁")
                digit_pieces += len(piece) == 1 and piece.isdigit()
        for word in WORD.findall(text):
            pieces = [p for p in sp.encode(word, out_type=str) if p != "▁"]
            (name_pieces if is_name(word) else word_pieces).append(len(pieces))
    return {
        "characters": chars,
        "byte_fallback_chars_per_10k": round(1e4 * sum(fallback.values()) / max(chars, 1), 2),
        "byte_fallback_commonest": "".join(ch for ch, _ in fallback.most_common(20)),
        "digits_as_digit_pieces": round(digit_pieces / digits, 4) if digits else None,
        "pieces_per_name": round(sum(name_pieces) / len(name_pieces), 3) if name_pieces else None,
        "pieces_per_word": round(sum(word_pieces) / len(word_pieces), 3) if word_pieces else None,
    }
