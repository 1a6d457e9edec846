"""A text's pieces: prepared for decoding (segmented, untranslatables masked, tokenised) and
assembled from their translations back into the text's layout."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.engine import Engine
from service.placeholders import Protected, protect
from service.request_types import SentenceResult, TextResult
from service.search import Hypothesis, Translation
from service.text import Segmented, split_long, split_sentences


@dataclass(frozen=True)
class Prepared:
    """One text ready to decode: its segmentation, and for each piece its token ids with its
    untranslatables masked (``service.placeholders``) and what restores them."""

    segmented: Segmented
    sources: list[list[int]]
    protected: list[Protected | None]  # None: nothing masked


def prepare_texts(texts: Sequence[str], engine: Engine, target_lang: str | None = None,
                  protect_items: bool = True) -> list[Prepared]:
    """Each text's segmentation and the token ids of its pieces, every piece short enough for
    the model (sentences longer than its positions are split, never cut). With
    ``protect_items`` placeholders, URLs, e-mail addresses, numbers and emoji are masked, so
    that each comes back verbatim, as often as it went in."""
    cache: dict[str, tuple[Protected | None, list[int]]] = {}

    def prepare(piece: str) -> tuple[Protected | None, list[int]]:
        if piece not in cache:
            protected = protect(piece) if protect_items else None
            masked = protected.text if protected else piece
            cache[piece] = protected, engine.tokenize(masked, target_lang)
        return cache[piece]

    prepared = []
    for text in texts:
        segmented = split_sentences(text)
        segmented = split_long(segmented, engine.max_source_tokens,
                               lambda p: len(prepare(p)[1]))
        protected, sources = zip(*map(prepare, segmented.pieces), strict=True) if (
            segmented.pieces) else ((), ())
        prepared.append(Prepared(segmented, list(sources), list(protected)))
    return prepared


def assemble(prepared: Prepared, translations: Sequence[Translation], num_alternatives: int,
             return_scores: bool, return_sentences: bool = False) -> TextResult:
    """One text's result: pieces' translations (untranslatables restored) in the original
    layout, the token-weighted mean score, and the k-th alternative built from each piece's
    k-th hypothesis; with ``return_sentences`` each piece's own."""
    # restored[i][k]: piece i's k-th hypothesis with its untranslatables put back
    restored = [[protected.restore(h.text).text if protected else h.text
                 for h in t.hypotheses[:num_alternatives + 1]]
                for protected, t in zip(prepared.protected, translations, strict=True)]
    variants: list[tuple[str, float | None]] = []
    for rank in range(num_alternatives + 1):
        chosen = [t.hypotheses[min(rank, len(t.hypotheses) - 1)] for t in translations]
        text = prepared.segmented.join([texts[min(rank, len(texts) - 1)] for texts in restored])
        if rank and any(text == seen for seen, _ in variants):
            continue  # a piece ran out of hypotheses: this would repeat an earlier text
        variants.append((text, _mean_score(chosen) if return_scores else None))
    (text, score), alternatives = variants[0], variants[1:]
    if not return_sentences:
        return TextResult(text, score, alternatives if num_alternatives else None)
    sentences = [
        SentenceResult(
            source, texts[0], _mean_score(t.hypotheses[:1]) if return_scores else None,
            [(other, _mean_score([h]) if return_scores else None)
             for other, h in zip(texts[1:], t.hypotheses[1:], strict=False)]
            if num_alternatives else None)
        for source, texts, t in zip(prepared.segmented.pieces, restored, translations,
                                    strict=True)]
    return TextResult(text, score, alternatives if num_alternatives else None, sentences,
                      list(prepared.segmented.separators))


def _mean_score(hypotheses: Sequence[Hypothesis]) -> float | None:
    """Mean log-probability per token over a text's sentences. Not the search's own score,
    which divides by length ** length_penalty: a client's threshold on this one must not move
    when a bundle's recommended length penalty does."""
    if not hypotheses:
        return None
    total = sum(h.log_prob for h in hypotheses) / sum(h.length for h in hypotheses)
    return total if math.isfinite(total) else None  # -inf has no JSON spelling
