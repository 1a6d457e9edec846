"""BLEU and chrF of a bundle on a test file, translated by the service's own ``Translator``
(segmentation, untranslatables masked, decoding options resolved as a request's, the default
variant and workers, the scheduler), so that a score is what the service answers; with them,
how often the output keeps the source's numbers, names and URLs (``training.verbatim``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sacrebleu

from service.loading import pair_label
from service.metrics import Metrics
from service.normalize import clean_text
from service.settings import Settings
from service.translator import Pair, TranslateOptions, Translator
from training.config import DataConfig
from training.corpus import _iter_raw, _short_name, read_tsv
from training.verbatim import verbatim_retention


def evaluate_bundle(
    bundle: str | Path,
    test_tsv: str | Path,
    *,
    beam_size: int | None = None,
    length_penalty: float | None = None,
    max_length_ratio: float | None = None,
    no_repeat_ngram_size: int | None = None,
    limit: int | None = None,
    variant: str | None = None,
    threads: int = 0,
    workers: int = 0,
    hypotheses_out: str | Path | None = None,
    by_source: DataConfig | None = None,
    target_lang: str | None = None,
) -> dict[str, Any]:
    """Translate the source side of ``test_tsv`` and score it against the target side.

    Each source line is one text, as a client would send it: lines holding several sentences
    are split and rejoined, sentences longer than the model's positions split into pieces.
    Options left None are what a request without them gets: the service's settings
    (``DEFAULT_BEAM``, ...), then the bundle's recommendation. The sentence cache is off, so
    that a line repeated in the file costs its decoding as the first did and the speed
    reported is the decoder's. With ``by_source`` (the data config that prepared the file) it
    also scores each source file's share of the pairs (``by_source``) and each of the
    config's ``domains`` (``by_domain``), to see which domains the model handles.
    ``target_lang`` picks the target language of a multilingual bundle."""
    pairs = read_tsv(test_tsv)[:limit] if limit else read_tsv(test_tsv)
    settings = Settings(
        model_dir=Path(bundle), models=[], device="cpu" if threads else "auto",
        threads=threads, workers=workers, variant=variant, cache_mb=0,
        # A beam wider than the service allows is still worth measuring.
        max_beam=max(beam_size or 1, Settings.model_fields["max_beam"].default))
    options = TranslateOptions(beam_size=beam_size, length_penalty=length_penalty,
                               max_length_ratio=max_length_ratio,
                               no_repeat_ngram_size=no_repeat_ngram_size)
    metrics = Metrics()
    with Translator.load(settings, metrics=metrics) as translator:
        pair = bundle_pair(translator, target_lang)
        decoding = translator.resolve(translator.engines[pair], options)  # loaded at start
        sources = [s for s, _ in pairs]
        references = [t for _, t in pairs]
        start = time.perf_counter()
        hypotheses = [r.text for r in translator.translate_batch(sources, pair, options)]
        seconds = time.perf_counter() - start
        variant = translator.engines[pair].variant
    if hypotheses_out:
        Path(hypotheses_out).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    labels = {"pair": pair_label(pair)}
    # Each decoded sentence's tokens and its EOS.
    generated = sum(metrics.registry.get_sample_value(name, labels) or 0 for name, labels in (
        ("translate_generated_tokens_total", labels),
        ("translate_sentences_total", {**labels, "outcome": "done"})))
    result = {
        "bundle": str(bundle),
        "variant": variant,
        "test": str(test_tsv),
        "sentences": len(pairs),
        "beam_size": decoding.beam_size,
        "length_penalty": decoding.length_penalty,
        "max_length_ratio": decoding.max_length_ratio,
        "no_repeat_ngram_size": decoding.no_repeat_ngram_size,
        **score_rows(sources, hypotheses, references),
        "seconds": round(seconds, 2),
        "target_tokens_per_s": round(generated / seconds, 1) if seconds else None,
    }
    if by_source is not None:
        groups = rows_by_source(pairs, hypotheses, by_source)
        result["by_source"] = {name: score_rows(*rows) for name, rows in groups.items()}
        domains = rows_by_domain(groups, by_source.domains)
        result["by_domain"] = {name: score_rows(*rows) for name, rows in domains.items()}
    return result


def bundle_pair(translator: Translator, target_lang: str | None) -> Pair:
    """The pair of the loaded bundle that translates into ``target_lang``; the only one when
    that is None."""
    pairs = sorted(translator.engines)
    if target_lang is None and len(pairs) == 1:
        return pairs[0]
    chosen = [pair for pair in pairs if pair[1] == (target_lang or "").lower()]
    if not chosen:
        targets = ", ".join(target for _, target in pairs)
        raise ValueError(f"give the target language (--target-lang): one of {targets}")
    return chosen[0]


Rows = tuple[list[str], list[str], list[str]]  # sources, hypotheses, references


def score_rows(sources: list[str], hypotheses: list[str], references: list[str]
               ) -> dict[str, Any]:
    """BLEU, chrF and the numbers/names/URLs kept of one set of translations."""
    return {
        "sentences": len(hypotheses),
        "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
        "verbatim": verbatim_retention(sources, references, hypotheses),
    }


def rows_by_source(pairs: list[tuple[str, str]], hypotheses: list[str], config: DataConfig
                   ) -> dict[str, Rows]:
    """{source file: (sources, hypotheses, references)}: each pair's origin found by reading
    the corpus files again, cleaned as ``prepare`` cleaned them."""
    wanted = set(pairs)
    origin: dict[tuple[str, str], str] = {}
    for source in config.sources:
        for raw in _iter_raw(source.path, config.source_lang, config.target_lang):
            if raw is not None:
                key = (clean_text(raw[0]), clean_text(raw[1]))
                if key in wanted:
                    origin.setdefault(key, _short_name(source.path))
    grouped: dict[str, Rows] = {}
    for pair, hypothesis in zip(pairs, hypotheses, strict=True):
        srcs, hyps, refs = grouped.setdefault(origin.get(pair, "unknown"), ([], [], []))
        srcs.append(pair[0])
        hyps.append(hypothesis)
        refs.append(pair[1])
    return dict(sorted(grouped.items()))


def rows_by_domain(groups: dict[str, Rows], domains: dict[str, list[str]]) -> dict[str, Rows]:
    """The rows of each domain's sources, merged in the order the domain names them. A domain
    naming no source file that the scored set has is an error: a typo would silently score
    nothing."""
    merged: dict[str, Rows] = {}
    for domain, names in domains.items():
        present = [name for name in names if name in groups]
        if not present:
            raise ValueError(f"data.domains.{domain}: none of {names} is a source of the scored "
                             f"set (its sources: {', '.join(groups)})")
        merged[domain] = tuple(  # type: ignore[assignment]
            [row for name in present for row in groups[name][part]] for part in range(3))
    return merged
