"""BLEU and chrF of a bundle on a test file, decoded by the serving engine itself, so that
training and serving are measured by the same code; with them, how often the output keeps the
source's numbers, names and URLs (``training.verbatim``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sacrebleu

from service.engine import Engine
from service.normalize import clean_text
from training.config import DataConfig
from training.corpus import _iter_raw, _short_name, read_tsv
from training.verbatim import verbatim_retention


def evaluate_bundle(
    bundle: str | Path,
    test_tsv: str | Path,
    *,
    beam_size: int = 1,
    length_penalty: float | None = None,
    max_length_ratio: float | None = None,
    no_repeat_ngram_size: int | None = None,
    limit: int | None = None,
    variant: str | None = None,
    threads: int = 0,
    workers: int = 0,
    max_batch_rows: int = 64,
    hypotheses_out: str | Path | None = None,
    by_source: DataConfig | None = None,
    target_lang: str | None = None,
) -> dict[str, Any]:
    """Translate the source side of ``test_tsv`` and score it against the target side.
    Sentences longer than the model's positions are skipped and counted, not cut. With
    ``by_source`` (the data config that prepared the file) it also scores each source file's
    share of the pairs (``by_source``) and each of the config's ``domains`` (``by_domain``), to
    see which domains the model handles. Decoding options left None are the bundle's
    recommendation, as in the service. ``target_lang`` picks the target language of a
    multilingual bundle."""
    pairs = read_tsv(test_tsv)[:limit] if limit else read_tsv(test_tsv)
    engine = Engine(
        bundle,
        device="cpu" if threads else "auto",
        threads=threads,
        variant=variant,
        workers=workers,  # 0: the service's default, so evaluation runs as fast as serving
    )
    usable = [(s, t) for s, t in pairs
              if len(engine.tokenize(s, target_lang)) <= engine.max_source_tokens]
    sources = [s for s, _ in usable]
    references = [t for _, t in usable]
    start = time.perf_counter()
    given = dict(length_penalty=length_penalty, max_length_ratio=max_length_ratio,
                 no_repeat_ngram_size=no_repeat_ngram_size)
    options = engine.options(beam_size=beam_size,
                             **{key: value for key, value in given.items() if value is not None})
    translations = engine.translate(sources, max_batch_rows=max_batch_rows,
                                    target_lang=target_lang, **vars(options))
    seconds = time.perf_counter() - start
    hypotheses = [t.text for t in translations]
    if hypotheses_out:
        Path(hypotheses_out).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    generated = sum(len(t.hypotheses[0].token_ids) + 1 for t in translations)
    result = {
        "bundle": str(bundle),
        "variant": engine.variant,
        "test": str(test_tsv),
        "sentences": len(usable),
        "skipped_too_long": len(pairs) - len(usable),
        "beam_size": beam_size,
        "length_penalty": options.length_penalty,
        "max_length_ratio": options.max_length_ratio,
        "no_repeat_ngram_size": options.no_repeat_ngram_size,
        **score_rows(sources, hypotheses, references),
        "seconds": round(seconds, 2),
        "target_tokens_per_s": round(generated / seconds, 1) if seconds else None,
    }
    if by_source is not None:
        groups = rows_by_source(usable, hypotheses, by_source)
        result["by_source"] = {name: score_rows(*rows) for name, rows in groups.items()}
        domains = rows_by_domain(groups, by_source.domains)
        result["by_domain"] = {name: score_rows(*rows) for name, rows in domains.items()}
    return result


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
