"""The everyday sentences (``configs/probes/everyday-en-de.tsv``) and the scores
``scripts/score-everyday.py`` gives: the set stays balanced and parseable, and "exact" and
"close" mean what its docstring says."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = {"travel", "home", "shopping", "health", "work", "weather", "time-and-dates"}


@pytest.fixture(scope="module")
def script() -> ModuleType:
    # The script's name has a hyphen, as the other scripts' do, so it is loaded by path.
    spec = importlib.util.spec_from_file_location("score_everyday",
                                                  ROOT / "scripts" / "score-everyday.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_set_has_every_category_and_no_repeated_source(script: ModuleType) -> None:
    sentences = script.read_sentences()
    counts = Counter(sentence.category for sentence in sentences)
    assert len(sentences) >= 200
    assert set(counts) == CATEGORIES
    assert min(counts.values()) >= 25, counts
    sources = [sentence.source for sentence in sentences]
    assert len(set(sources)) == len(sources)
    for sentence in sentences:
        # A stray tab or an empty cell would shift a column and score the wrong pair.
        assert sentence.source.strip() and sentence.reference.strip(), sentence
        assert "\t" not in sentence.source + sentence.reference, sentence


def test_exact_ignores_only_whitespace_and_close_counts_exact_ones(script: ModuleType) -> None:
    references = ["Wo ist der Bahnhof?", "Ich hätte gern eine Rückfahrkarte, bitte.",
                  "Wie lange dauert die Fahrt?"]
    outputs = ["Wo ist der  Bahnhof? ",  # exact: whitespace only
               "Ich hätte gerne eine Rückfahrkarte, bitte.",  # close (chrF 94)
               "Wie lange dauert die Reise?"]  # a synonym: chrF 71, not close
    scores = script.score(outputs, references)
    assert (scores.count, scores.exact, scores.close) == (3, 1, 2)
    assert script.score(["wo ist der bahnhof?"], references[:1]).exact == 0  # case counts
