"""Evaluation scores a bundle as the service translates, overall and per corpus file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.engine import Engine
from service.settings import Settings
from training.cli import main
from training.config import DataConfig, SourceFile
from training.corpus import read_tsv
from training.evaluate import evaluate_bundle

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"


def test_scores_overall_and_by_source(tiny_bundle: Path, tmp_path: Path) -> None:
    pairs = read_tsv(FIXTURE)[:12]
    # Two "corpus files": the memorised pairs, and the same sources with wrong references.
    (tmp_path / "learned.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:8]))
    (tmp_path / "other.tsv").write_text("".join(f"{s}\tganz falsch hier\n" for s, _ in pairs[8:]))
    test = tmp_path / "test.tsv"
    test.write_text((tmp_path / "learned.tsv").read_text() + (tmp_path / "other.tsv").read_text())
    sources = [SourceFile(str(tmp_path / "learned.tsv")), SourceFile(str(tmp_path / "other.tsv"))]

    data = DataConfig(sources=sources, domains={"both": ["other", "learned"],
                                                "memorised": ["learned"]})
    result = evaluate_bundle(tiny_bundle, test, threads=1, by_source=data,
                             hypotheses_out=tmp_path / "hyp.txt")

    assert result["sentences"] == 12
    assert 0 < result["bleu"] < 100
    learned = result["by_source"]["learned"]
    assert (learned["sentences"], learned["bleu"], learned["chrf"]) == (8, 100.0, 100.0)
    assert result["by_source"]["other"]["sentences"] == 4
    assert result["by_source"]["other"]["bleu"] < 5
    # A domain is its sources' rows scored together: the whole set, or one source again.
    assert {k: result["by_domain"]["both"][k] for k in ("sentences", "bleu", "chrf")} == {
        k: result[k] for k in ("sentences", "bleu", "chrf")}
    assert result["by_domain"]["memorised"] == learned
    hypotheses = (tmp_path / "hyp.txt").read_text().splitlines()
    assert hypotheses[:8] == [t for _, t in pairs[:8]]


def test_a_domain_naming_no_scored_source_is_an_error(tiny_bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "learned.tsv").write_text("".join(f"{s}\t{t}\n"
                                                  for s, t in read_tsv(FIXTURE)[:3]))
    data = DataConfig(sources=[SourceFile(str(tmp_path / "learned.tsv"))],
                      domains={"dialogue": ["games-dialogue"]})
    with pytest.raises(ValueError, match=r"data\.domains\.dialogue"):
        evaluate_bundle(tiny_bundle, tmp_path / "learned.tsv", threads=1, by_source=data)


def test_verbatim_retention_is_reported(tiny_bundle: Path, tmp_path: Path) -> None:
    # The memorised pairs decode to their references, so every expected item is kept.
    pairs = [p for p in read_tsv(FIXTURE) if any(ch.isdigit() or ch.isupper() for ch in p[0][1:])]
    test = tmp_path / "test.tsv"
    test.write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:8]))
    result = evaluate_bundle(tiny_bundle, test, threads=1)
    kept = [k for k in ("numbers", "names") if result["verbatim"][k]["expected"]]
    assert kept and all(result["verbatim"][k]["rate"] == 100.0 for k in kept)


def test_a_line_of_several_sentences_is_translated_as_the_service_would(
        tiny_bundle: Path, tmp_path: Path) -> None:
    # Each sentence alone is memorised; the model never saw them joined on one line.
    (s1, t1), (s2, t2), (s3, t3) = read_tsv(FIXTURE)[:3]
    test = tmp_path / "test.tsv"
    test.write_text(f"{s1} {s2}\t{t1} {t2}\n{s3}\t{t3}\n")
    result = evaluate_bundle(tiny_bundle, test, threads=1, hypotheses_out=tmp_path / "hyp")
    assert (tmp_path / "hyp").read_text().splitlines() == [f"{t1} {t2}", t3]
    assert (result["sentences"], result["bleu"]) == (2, 100.0)


def test_options_left_out_are_the_services(tiny_bundle: Path, tmp_path: Path) -> None:
    test = tmp_path / "test.tsv"
    test.write_text("".join(f"{s}\t{t}\n" for s, t in read_tsv(FIXTURE)[:2]))
    result = evaluate_bundle(tiny_bundle, test, threads=1)
    assert result["beam_size"] == Settings().default_beam


def test_cli_passes_the_decoding_options(tiny_bundle: Path, tmp_path: Path, capsys) -> None:
    engine = Engine(tiny_bundle, threads=1)
    encode = engine.vocabulary.source.encode
    pairs = sorted(read_tsv(FIXTURE), key=lambda p: -len(encode(p[1])))[:6]
    assert len(encode(pairs[0][1])) > 10  # else the cap below proves nothing
    test = tmp_path / "test.tsv"
    test.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    hyp = tmp_path / "hyp.txt"
    main(["evaluate", str(tiny_bundle), str(test), "--threads", "1", "--beam-size", "2",
          "--length-penalty", "0.5", "--max-length-ratio", "0.01", "--hypotheses", str(hyp)])
    result = json.loads(capsys.readouterr().out)
    assert (result["beam_size"], result["length_penalty"], result["max_length_ratio"]) == (
        2, 0.5, 0.01)
    # A ratio of 0.01 leaves the absolute allowance: at most 10 target tokens per sentence.
    assert all(len(encode(h)) <= 10 for h in hyp.read_text().splitlines())
