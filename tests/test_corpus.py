import gzip
import json
import lzma
import random
from collections import Counter
from pathlib import Path

import pytest

from training.config import DataConfig, FilterConfig, SourceFile
from training.corpus import (
    FILTERS,
    MAX_HELDOUT_COMPONENT,
    clean_text,
    format_report,
    normalise,
    prepare_corpus,
    read_pairs,
    read_tsv,
)
from training.number_words import spell_out
from training.place_names import PlaceSwapper, exonym_terms, write_bundle_terms

FIXTURES = Path(__file__).parent / "fixtures"
OVERFIT = FIXTURES / "overfit.tsv"
NOISY = FIXTURES / "noisy.tsv"
SHARED = FIXTURES / "shared.tsv"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _config(tmp_path: Path, *sources: SourceFile, name: str = "out", **kwargs) -> DataConfig:
    kwargs.setdefault("dev_size", 0)
    kwargs.setdefault("test_size", 0)
    return DataConfig(sources=list(sources), out_dir=str(tmp_path / name), **kwargs)


def _write_moses(prefix: Path, pairs: list[tuple[str, str]], suffix: str = "") -> None:
    writers = {"": open, ".gz": gzip.open, ".xz": lzma.open}
    for lang, side in (("en", 0), ("de", 1)):
        with writers[suffix](f"{prefix}.{lang}{suffix}", "wt", encoding="utf-8") as f:
            f.writelines(pair[side] + "\n" for pair in pairs)


# --- reading ---------------------------------------------------------------------------------


def test_read_tsv_fixture():
    pairs = read_tsv(OVERFIT)
    assert len(pairs) == len(_lines(OVERFIT))
    assert pairs[0] == ("The cat is sleeping on the sofa.", "Die Katze schläft auf dem Sofa.")


def test_read_tsv_rejects_malformed_split(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("a\tb\nonly one field\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:2"):
        read_tsv(path)


def test_read_pairs_skips_malformed_lines():
    pairs = list(read_pairs(str(NOISY)))
    assert len(pairs) == len(_lines(NOISY)) - 2
    assert ("", "Die Quelle fehlt.") in pairs  # raw: empty sides are for the filters to count


@pytest.mark.parametrize("opener,suffix", [(gzip.open, ".gz"), (lzma.open, ".xz")])
def test_read_compressed_tsv(tmp_path, opener, suffix):
    path = tmp_path / f"overfit.tsv{suffix}"
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(OVERFIT.read_text(encoding="utf-8"))
    assert list(read_pairs(str(path))) == read_tsv(OVERFIT)
    assert read_tsv(path) == read_tsv(OVERFIT)


@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_read_moses_pair(tmp_path, suffix):
    pairs = read_tsv(OVERFIT)
    _write_moses(tmp_path / "corpus", pairs, suffix)
    assert list(read_pairs(str(tmp_path / "corpus"))) == pairs
    # The language codes choose the files, so the reverse direction is just a parameter.
    reverse = list(read_pairs(str(tmp_path / "corpus"), source_lang="de", target_lang="en"))
    assert reverse == [(de, en) for en, de in pairs]


def test_moses_pair_with_different_line_counts_is_an_error(tmp_path):
    (tmp_path / "x.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "x.de").write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(ValueError, match="different line counts"):
        list(read_pairs(str(tmp_path / "x")))


def test_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="Moses pair"):
        list(read_pairs(str(tmp_path / "nothing")))


def test_carriage_return_inside_a_field_does_not_split_the_line(tmp_path):
    path = tmp_path / "cr.tsv"
    path.write_bytes(b"left\rover\tlinks\r\nsecond\tzweite\n")
    assert list(read_pairs(str(path))) == [("left\rover", "links"), ("second", "zweite")]


# --- cleaning --------------------------------------------------------------------------------


def test_clean_text():
    assert clean_text("  a \t b\n") == "a b"
    assert clean_text("Cafe\u0301") == "Café"  # NFD -> NFC
    invisible = "soft\u00adhyphen\ufeff and\u200b zero\x00width\u200e"
    assert clean_text(invisible) == "softhyphen and zerowidth"
    assert clean_text("line\x85break\u2028here") == "line break here"
    assert clean_text("\u00a0non-breaking\u00a0space\u202f%") == "non-breaking space %"
    assert clean_text("family 👨\u200d👩\u200d👧") == "family 👨\u200d👩\u200d👧"  # ZWJ kept
    assert clean_text("„Anführungszeichen“ »und« …") == "„Anführungszeichen“ »und« …"
    assert clean_text("\x01\x1b[0m") == "[0m"
    # Windows-1252 bytes that were decoded as Latin-1 (seen in the Ding dictionary).
    assert clean_text("d\x92art, Wiedemann\x96Franz\x81") == "d’art, Wiedemann–Franz"


def test_normalise():
    assert normalise("GOOD  Morning, everybody!") == "good morning everybody"
    assert normalise("Chapter 12, verse 3") == normalise("chapter 45 verse 7")
    assert normalise("Straße") == normalise("STRASSE")
    assert normalise("%s_file") == "sfile"


# --- filters and dedupe ----------------------------------------------------------------------


def test_each_filter_counts_what_it_drops(tmp_path):
    filters = FilterConfig(min_tokens=2, max_tokens=15, max_ratio=3.0)
    report = prepare_corpus(_config(tmp_path, SourceFile(str(NOISY)), filters=filters),
                            progress=False)
    counts = report["files"][str(NOISY)]
    assert {key: counts[key] for key in ("read", *FILTERS, "kept")} == {
        "read": 18,
        "malformed": 2,
        "empty": 2,
        "too_short": 1,
        "too_long": 1,
        "ratio": 1,
        "source_equals_target": 1,
        "duplicate_exact": 1,
        "duplicate_normalised": 2,
        "kept": 7,
    }
    kept = read_tsv(tmp_path / "out" / "train.tsv")
    assert sorted(kept) == sorted([
        ("Good morning, everybody.", "Guten Morgen, alle zusammen."),
        ("Open Source Software.", "open source software"),  # differs in case: not a copy
        ("Chapter 3 begins here.", "Kapitel 3 beginnt hier."),
        ("The lake is frozen in winter.", "Im Winter ist der See zugefroren."),
        ("Too much space here.", "Zu viel Platz hier."),
        ("Save the file as %s?", "Datei als %s speichern?"),
        ("Show <b>all</b> results.", "<b>Alle</b> Ergebnisse anzeigen."),
    ])


def test_source_equals_target_is_case_sensitive(tmp_path):
    path = tmp_path / "copies.tsv"
    path.write_text("trend\tTrend\n"  # German capitalises nouns: a real translation
                    "OK\tOK\n"
                    "Firefox Web Browser\tFirefox Web Browser.\n"
                    "Version 2.0\tVersion 3.1\n"
                    "the hamburger\tthe Hamburger\n", encoding="utf-8")
    report = prepare_corpus(_config(tmp_path, SourceFile(str(path))), progress=False)
    assert report["total"]["source_equals_target"] == 3
    assert sorted(read_tsv(tmp_path / "out" / "train.tsv")) == [
        ("the hamburger", "the Hamburger"), ("trend", "Trend")]


def test_filters_can_be_switched_off(tmp_path):
    filters = FilterConfig(min_tokens=1, max_tokens=1000, max_ratio=100.0,
                           drop_source_equals_target=False, dedupe=False)
    report = prepare_corpus(_config(tmp_path, SourceFile(str(NOISY)), filters=filters),
                            progress=False)
    counts = report["total"]
    assert counts["malformed"] == 2 and counts["empty"] == 2
    assert counts["kept"] == 14
    assert sum(counts[f] for f in FILTERS if f not in ("malformed", "empty")) == 0


def test_dedupe_across_files_keeps_the_first(tmp_path):
    copy = tmp_path / "copy.tsv"
    # The same pairs again, one exact, one differing only in case and punctuation.
    copy.write_text("The soup is too hot.\tDie Suppe ist zu heiß.\n"
                    "the SOUP is too hot\tDie Suppe ist zu heiß!\n"
                    "A new sentence here.\tEin neuer Satz hier.\n", encoding="utf-8")
    report = prepare_corpus(_config(tmp_path, SourceFile(str(OVERFIT)), SourceFile(str(copy))),
                            progress=False)
    assert report["files"][str(OVERFIT)]["kept"] == len(_lines(OVERFIT))
    second = report["files"][str(copy)]
    assert (second["duplicate_exact"], second["duplicate_normalised"], second["kept"]) == (1, 1, 1)


def test_report_counts_add_up(tmp_path):
    sources = [SourceFile(str(NOISY)), SourceFile(str(OVERFIT), 2.0), SourceFile(str(SHARED))]
    config = _config(tmp_path, *sources, dev_size=6, test_size=6)
    report = prepare_corpus(config, progress=False)
    for counts in [*report["files"].values(), report["total"]]:
        assert counts["kept"] + sum(counts[f] for f in FILTERS) == counts["read"]
        held = counts["train"] + counts["dev"] + counts["test"]
        assert held + counts["train_ratio"] == counts["kept"]
    total = report["total"]
    assert total["read"] == sum(len(_lines(p)) for p in (NOISY, OVERFIT, SHARED))
    splits = report["splits"]
    assert (splits["train"], splits["dev"], splits["test"]) == (
        total["train"], total["dev"], total["test"])
    out = Path(config.out_dir)
    assert len(read_tsv(out / "train.tsv")) == splits["train_weighted"] == total["train_weighted"]
    assert len(read_tsv(out / "dev.tsv")) == 6 and len(read_tsv(out / "test.tsv")) == 6
    assert json.loads((out / "report.json").read_text(encoding="utf-8")) == report
    table = format_report(report)
    assert "TOTAL" in table and "noisy" in table and f"{total['read']:,}" in table


# --- split -----------------------------------------------------------------------------------


def _split_config(tmp_path: Path, name: str, seed: int = 1234, **kwargs) -> DataConfig:
    return _config(tmp_path, SourceFile(str(OVERFIT)), SourceFile(str(SHARED)), name=name,
                   dev_size=12, test_size=12, seed=seed, **kwargs)


def _split_files(out_dir: str) -> dict[str, bytes]:
    return {name: (Path(out_dir) / name).read_bytes()
            for name in ("train.tsv", "dev.tsv", "test.tsv")}


def test_split_is_deterministic(tmp_path):
    first, second = _split_config(tmp_path, "a"), _split_config(tmp_path, "b")
    prepare_corpus(first, progress=False)
    prepare_corpus(second, progress=False)
    assert _split_files(first.out_dir) == _split_files(second.out_dir)
    other = _split_config(tmp_path, "c", seed=99)
    prepare_corpus(other, progress=False)
    assert _split_files(other.out_dir)["test.tsv"] != _split_files(first.out_dir)["test.tsv"]


@pytest.mark.parametrize("seed", [1, 2, 3, 1234])
def test_split_is_leak_free(tmp_path, seed):
    config = _split_config(tmp_path, "out", seed=seed)
    report = prepare_corpus(config, progress=False)
    splits = {name: read_tsv(Path(config.out_dir) / f"{name}.tsv")
              for name in ("train", "dev", "test")}
    assert len(splits["dev"]) == 12 and len(splits["test"]) == 12
    for side in (0, 1):
        keys = {name: {normalise(pair[side]) for pair in pairs} for name, pairs in splits.items()}
        assert not keys["train"] & keys["dev"]
        assert not keys["train"] & keys["test"]
        assert not keys["dev"] & keys["test"]
    # Nothing that was deduplicated away comes back: 31 lines, one normalised duplicate.
    assert report["files"][str(SHARED)]["duplicate_normalised"] == 1
    # The "Cancel/Abbrechen/Beenden" cluster is one component of 8, too big for held-out sets.
    assert report["components"]["largest_component"] == 8 > MAX_HELDOUT_COMPONENT
    train_sources = {src for src, _ in splits["train"]}
    assert {"Cancel", "Abort", "Stop", "Quit", "Exit"} <= train_sources


def test_split_puts_linked_pairs_together(tmp_path):
    config = _split_config(tmp_path, "out")
    prepare_corpus(config, progress=False)
    where = {pair: name for name in ("train", "dev", "test")
             for pair in read_tsv(Path(config.out_dir) / f"{name}.tsv")}
    # A chain: same normalised source, then same normalised target.
    chain = [("Thank you.", "Danke."), ("Thank you!", "Vielen Dank."),
             ("Thanks a lot.", "Vielen Dank!")]
    assert len({where[pair] for pair in chain}) == 1


# --- weights ---------------------------------------------------------------------------------


def test_weights_resample_train_only(tmp_path):
    config = _config(tmp_path, SourceFile(str(OVERFIT), weight=2.0),
                     SourceFile(str(SHARED), weight=0.5), dev_size=8, test_size=8)
    report = prepare_corpus(config, progress=False)
    out = Path(config.out_dir)
    train = Counter(read_tsv(out / "train.tsv"))
    overfit = set(read_tsv(OVERFIT))
    shared = set(read_tsv(SHARED))
    heldout = read_tsv(out / "dev.tsv") + read_tsv(out / "test.tsv")
    assert len(heldout) == len(set(heldout)) == 16
    assert not set(heldout) & set(train)
    over = report["files"][str(OVERFIT)]
    assert over["train_weighted"] == 2 * over["train"]
    assert all(count == 2 for pair, count in train.items() if pair in overfit)
    assert sum(1 for pair in train if pair in overfit) == over["train"]
    half = report["files"][str(SHARED)]
    assert 0 < half["train_weighted"] < half["train"]
    assert all(count == 1 for pair, count in train.items() if pair in shared)


def test_fractional_weight_above_one_is_deterministic(tmp_path):
    def run(name: str) -> tuple[dict, bytes]:
        config = _config(tmp_path, SourceFile(str(OVERFIT), weight=1.5), name=name)
        report = prepare_corpus(config, progress=False)
        return report["files"][str(OVERFIT)], (Path(config.out_dir) / "train.tsv").read_bytes()

    (counts, data), (_, again) = run("a"), run("b")
    assert data == again
    n = counts["train"]
    assert n < counts["train_weighted"] < 2 * n
    train = Counter(read_tsv(tmp_path / "a" / "train.tsv"))
    assert set(train) == set(read_tsv(OVERFIT)) and set(train.values()) == {1, 2}


def test_negative_weight_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="weight"):
        prepare_corpus(_config(tmp_path, SourceFile(str(OVERFIT), weight=-1)), progress=False)


# --- held-out sets per source ----------------------------------------------------------------


def _word(i: int) -> str:
    # Letters only: normalise() folds digits, which would make numbered sentences duplicates.
    return "".join(chr(ord("a") + (i // 26**k) % 26) for k in (2, 1, 0))


def _write_source(tmp_path: Path, name: str, singles: int, pairs_of_two: int = 0) -> str:
    """``singles`` unrelated pairs plus ``pairs_of_two`` components of two pairs that share a
    source sentence, all distinct from any other source's."""
    lines = [f"The {name} says {_word(i)}.\tDer {name} sagt {_word(i)}.\n"
             for i in range(singles)]
    for i in range(pairs_of_two):
        lines.append(f"Hello {name} {_word(i)}.\tHallo {name} {_word(i)}.\n")
        lines.append(f"Hello {name} {_word(i)}!\tGrüß dich, {name} {_word(i)}.\n")
    path = tmp_path / f"{name}.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


def _splits(config: DataConfig) -> dict[str, list[tuple[str, str]]]:
    return {name: read_tsv(Path(config.out_dir) / f"{name}.tsv")
            for name in ("train", "dev", "test")}


def _assert_leak_free(splits: dict[str, list[tuple[str, str]]]) -> None:
    for side in (0, 1):
        keys = {name: {normalise(pair[side]) for pair in pairs} for name, pairs in splits.items()}
        assert not keys["train"] & keys["dev"]
        assert not keys["train"] & keys["test"]
        assert not keys["dev"] & keys["test"]


@pytest.mark.parametrize("seed", [1, 2, 1234])
def test_heldout_sets_get_an_equal_share_of_each_source(tmp_path, seed):
    paths = [_write_source(tmp_path, "phrases", 400, 40), _write_source(tmp_path, "bible", 60, 5),
             _write_source(tmp_path, "ui", 30, 5)]
    config = _config(tmp_path, *map(SourceFile, paths), dev_size=30, test_size=30, seed=seed)
    assert config.heldout_per_source  # the default
    report = prepare_corpus(config, progress=False)
    splits = _splits(config)
    assert len(splits["dev"]) == 30 and len(splits["test"]) == 30
    for path in paths:
        # An equal share, to within one component (of two pairs here).
        assert 9 <= report["files"][path]["dev"] <= 11
        assert 9 <= report["files"][path]["test"] <= 11
    _assert_leak_free(splits)
    assert "equal share per source" in format_report(report)


def test_heldout_shares_size_each_source_and_zero_gives_nothing(tmp_path):
    paths = [_write_source(tmp_path, name, 200) for name in ("everyday", "ui", "games", "none")]
    shares = [4.0, 1.0, 1.5, 0.0]
    config = _config(tmp_path, *(SourceFile(p, heldout_share=s) for p, s in zip(paths, shares,
                                                                              strict=True)),
                     dev_size=65, test_size=65)
    report = prepare_corpus(config, progress=False)
    for split in ("dev", "test"):
        # 65 pairs over 6.5 shares: 40, 10 and 15, to within one pair.
        counts = [report["files"][path][split] for path in paths]
        assert abs(counts[0] - 40) <= 1 and abs(counts[1] - 10) <= 1
        assert abs(counts[2] - 15) <= 1 and counts[3] == 0
        assert sum(counts) == 65
    assert report["files"][paths[3]]["train"] == 200
    _assert_leak_free(_splits(config))
    assert "configured share per source" in format_report(report)


def test_a_negative_heldout_share_is_refused(tmp_path):
    path = _write_source(tmp_path, "ui", 10)
    with pytest.raises(ValueError, match="heldout_share must be >= 0"):
        prepare_corpus(_config(tmp_path, SourceFile(path, heldout_share=-1)), progress=False)


def test_a_source_short_of_its_share_leaves_the_rest_to_the_others(tmp_path):
    paths = [_write_source(tmp_path, "big", 200), _write_source(tmp_path, "mid", 100),
             _write_source(tmp_path, "tiny", 4)]
    config = _config(tmp_path, *map(SourceFile, paths), dev_size=30, test_size=30)
    report = prepare_corpus(config, progress=False)
    big, mid, tiny = (report["files"][path] for path in paths)
    assert (tiny["test"], tiny["dev"], tiny["train"]) == (4, 0, 0)
    assert (big["test"], mid["test"]) == (13, 13)
    assert (big["dev"], mid["dev"]) == (15, 15)


def test_component_spanning_sources_belongs_to_its_first_pair(tmp_path):
    first = tmp_path / "first.tsv"
    first.write_text("Good night.\tGute Nacht.\n", encoding="utf-8")
    second = tmp_path / "second.tsv"
    second.write_text("Good night!\tSchlaf gut.\n", encoding="utf-8")
    config = _config(tmp_path, SourceFile(str(first)), SourceFile(str(second)), dev_size=0,
                     test_size=2)
    report = prepare_corpus(config, progress=False)
    # One component of two pairs, drawn for "first"; "second" has nothing of its own.
    assert report["components"]["components"] == 1
    assert sorted(_splits(config)["test"]) == [("Good night!", "Schlaf gut."),
                                               ("Good night.", "Gute Nacht.")]
    assert report["files"][str(first)]["test"] == report["files"][str(second)]["test"] == 1


@pytest.mark.parametrize("per_source", [True, False])
def test_excluded_sources_never_reach_heldout_sets(tmp_path, per_source):
    phrases = _write_source(tmp_path, "ding-phrases", 300, 20)
    other = _write_source(tmp_path, "sentences", 60, 5)
    # A component that spans both files and, "sentences" being read first, belongs to it: one
    # excluded pair keeps the whole component in train, or that phrase would reach dev/test.
    linked = Path(other)
    linked.write_text(linked.read_text(encoding="utf-8")
                      + "The ding-phrases says aaa!\tEin ganz anderer Satz.\n", encoding="utf-8")
    config = _config(tmp_path, SourceFile(other), SourceFile(phrases), dev_size=20, test_size=20,
                     heldout_per_source=per_source, heldout_exclude=["ding-phrases"])
    report = prepare_corpus(config, progress=False)
    assert report["files"][phrases]["dev"] == report["files"][phrases]["test"] == 0
    assert report["files"][phrases]["train"] == report["files"][phrases]["kept"]
    assert report["files"][other]["dev"] == report["files"][other]["test"] == 20
    splits = _splits(config)
    assert ("The ding-phrases says aaa!", "Ein ganz anderer Satz.") in splits["train"]
    _assert_leak_free(splits)
    assert "never from ding-phrases" in format_report(report)


def test_global_heldout_draw_is_still_available(tmp_path):
    paths = [_write_source(tmp_path, "big", 300), _write_source(tmp_path, "small", 30),
             _write_source(tmp_path, "smaller", 30)]

    def run(name: str, per_source: bool) -> dict:
        config = _config(tmp_path, *map(SourceFile, paths), name=name, dev_size=15, test_size=15,
                         heldout_per_source=per_source)
        return prepare_corpus(config, progress=False)

    stratified, global_ = run("strat", True), run("global", False)
    assert [stratified["files"][path]["test"] for path in paths] == [5, 5, 5]
    # The global draw follows the sources' sizes: "big" is 300 of 360 pairs.
    assert global_["files"][paths[0]]["test"] > 8 and global_["files"][paths[0]]["dev"] > 8
    assert global_["splits"]["dev"] == global_["splits"]["test"] == 15
    assert "one global draw" in format_report(global_)


def test_reused_heldout_sets_stay_fixed_when_the_filters_change(tmp_path):
    first = _split_config(tmp_path, "first")
    prepare_corpus(first, progress=False)
    drawn = {name: read_tsv(Path(first.out_dir) / f"{name}.tsv") for name in ("dev", "test")}
    # A filter experiment: what the filters keep changes, so a fresh draw would move dev/test.
    strict = _split_config(tmp_path, "strict", heldout_from=first.out_dir,
                           filters=FilterConfig(max_ratio=1.3))
    report = prepare_corpus(strict, progress=False)
    assert report["total"]["ratio"] > 0
    for name, pairs in drawn.items():
        assert read_tsv(Path(strict.out_dir) / f"{name}.tsv") == pairs
    train = read_tsv(Path(strict.out_dir) / "train.tsv")
    assert train
    heldout = drawn["dev"] + drawn["test"]
    for side in (0, 1):
        assert not {normalise(p[side]) for p in train} & {normalise(p[side]) for p in heldout}
    assert "reused" in format_report(report)


def test_a_train_only_ratio_keeps_dev_and_test_and_counts_what_it_drops(tmp_path):
    loose = _split_config(tmp_path, "loose")
    prepare_corpus(loose, progress=False)
    strict = _split_config(tmp_path, "strict", filters=FilterConfig(train_max_ratio=1.3))
    report = prepare_corpus(strict, progress=False)
    for name in ("dev.tsv", "test.tsv"):
        assert _split_files(strict.out_dir)[name] == _split_files(loose.out_dir)[name]
    loose_train = set(read_tsv(Path(loose.out_dir) / "train.tsv"))
    strict_train = set(read_tsv(Path(strict.out_dir) / "train.tsv"))
    dropped = loose_train - strict_train
    assert dropped and strict_train < loose_train
    assert all((max(len(s), len(t)) + 1) / (min(len(s), len(t)) + 1) > 1.3 for s, t in dropped)
    assert report["total"]["train_ratio"] == len(dropped)
    assert "tr.ratio" in format_report(report)


# --- numbers spelled out -----------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target", "expected"), [
    ("The airport is 20 kilometres away.", "Der Flughafen ist 20 Kilometer entfernt.",
     ("The airport is twenty kilometres away.", "Der Flughafen ist zwanzig Kilometer entfernt.")),
    ("21 people came.", "21 Leute kamen.",
     ("Twenty-one people came.", "Einundzwanzig Leute kamen.")),
    ("He waited 31 days.", "Er wartete 31 Tage.", ("He waited thirty-one days.",
                                                  "Er wartete einunddreißig Tage.")),
])
def test_spell_out_writes_the_number_in_words_on_both_sides(source, target, expected):
    assert spell_out(source, target, "en", "de") == expected


@pytest.mark.parametrize(("source", "target"), [
    ("Wait 1 minute.", "Warte 1 Minute."),  # "eine Minute": the form agrees with the noun
    ("Wait 100 minutes.", "Warte 100 Minuten."),  # outside 2-99
    ("It costs 3.5 euros.", "Es kostet 3,5 Euro."),  # a decimal
    ("Meet at 10:30 tonight.", "Treffen um 10:30 heute Abend."),  # a time
    ("See chapter 5 for details.", "Siehe Kapitel 5 für Details."),  # a label
    ("Translations for Qt 5 widgets", "Übersetzungen für Qt 5 Widgets"),  # a name
    ("Between 5 and 10 minutes.", "Zwischen 5 und 10 Minuten."),  # two numbers
    ("Buy 20 apples.", "Kaufe 30 Äpfel."),  # the sides disagree
    ("The limit is 20.", "Die Grenze ist 20."),  # counts nothing
    ("Press crypt(3) now.", "Drücke crypt(3) jetzt."),  # glued to a word
])
def test_spell_out_leaves_pairs_whose_number_is_not_a_plain_count(source, target):
    assert spell_out(source, target, "en", "de") is None


def test_spell_out_can_put_another_number_in_its_place():
    assert spell_out("I have 3 cats.", "Ich habe 3 Katzen.", "en", "de", number=45) == (
        "I have forty-five cats.", "Ich habe fünfundvierzig Katzen.")


def test_prepare_adds_spelled_out_copies_to_train_only(tmp_path):
    counts = [f"We saw {n} {_word(n)} birds today.\tWir sahen heute {n} {_word(n)} Vögel.\n"
              for n in range(2, 42)]
    path = tmp_path / "counts.tsv"
    path.write_text("".join(counts), encoding="utf-8")
    config = _config(tmp_path, SourceFile(str(path)), SourceFile(str(OVERFIT)), dev_size=5,
                     test_size=5, spell_numbers=3)
    report = prepare_corpus(config, progress=False)
    splits = _splits(config)

    def has_digit(pair: tuple[str, str]) -> bool:
        return any(ch.isdigit() for ch in pair[1])

    counted = [pair for pair in splits["train"] if " sahen heute " in pair[1]]
    numbered = [pair for pair in counted if has_digit(pair)]
    spelled = Counter(pair for pair in counted if not has_digit(pair))
    assert sum(spelled.values()) == 3 * len(numbered) == report["splits"]["spelled_numbers"]
    for source, target in numbered:  # the first copy keeps its number
        assert spelled[spell_out(source, target, "en", "de")] >= 1
    held = [pair for pair in splits["dev"] + splits["test"] if " sahen heute " in pair[1]]
    assert held and all(has_digit(pair) for pair in held)  # dev and test stay as they were
    assert len(splits["train"]) == report["splits"]["train_weighted"]


# --- places swapped ----------------------------------------------------------------------------

GAZETTEER = [
    ("London", "London"), ("Berlin", "Berlin"), ("Vienna", "Wien"), ("Munich", "München"),
    ("Kalamáta", "Kalamata"),  # differs by an accent only: not an exonym
    ("Switzerland", "Schweiz"),  # "in die Schweiz": takes an article
    ("Hamilton (Bermuda)", "Hamilton (Bermuda)"),  # a qualified catalogue entry
    ("Argostólion", "Argostoli"),  # nobody writes it: not in the corpus
]
USED = [("I live in Vienna.", "Ich wohne in Wien."), ("Munich is big.", "München ist groß."),
        ("Vienna again.", "Wieder Wien."), ("Munich again.", "Wieder München.")]


def _swapper() -> PlaceSwapper:
    return PlaceSwapper(GAZETTEER, "de", corpus=USED)


def test_place_swapper_keeps_the_exonyms_the_corpus_uses():
    swapper = _swapper()
    assert swapper.exonyms == [("Munich", "München"), ("Vienna", "Wien")]
    assert PlaceSwapper(GAZETTEER, "de").exonyms == [  # without a corpus: all that differ
        ("Argostólion", "Argostoli"), ("Munich", "München"), ("Vienna", "Wien")]
    assert not PlaceSwapper(GAZETTEER, "xx").active  # no prepositions known for it


def test_place_swapper_puts_an_exonym_in_both_sides():
    swapped = _swapper().swap("We are flying to London tomorrow.",
                              "Wir fliegen morgen nach London.", random.Random(1))
    assert swapped in {("We are flying to Vienna tomorrow.", "Wir fliegen morgen nach Wien."),
                       ("We are flying to Munich tomorrow.", "Wir fliegen morgen nach München.")}


@pytest.mark.parametrize(("source", "target"), [
    ("London is big.", "London ist groß."),  # no preposition before it
    ("From London to Berlin.", "Von London nach Berlin."),  # two places
    ("He went to London.", "Er fuhr nach Paris."),  # the sides disagree
    ("Ask in London Software.", "Frag bei London Software."),  # a company's name
    ("Hamilton (city in London)", "Hamilton (Stadt in London)"),  # a catalogue template
    ("The University of London", "Die Universität von London"),  # "of": more than a place
])
def test_place_swapper_leaves_pairs_it_cannot_swap_safely(source, target):
    assert _swapper().swap(source, target, random.Random(1)) is None


def test_the_exonyms_a_bundle_gets_are_those_its_corpus_translates_so():
    gazetteer = [*GAZETTEER, ("Jordan", "Jordanien"), ("Zurich", "Zürich"),
                 ("Central African Republic", "Zentralafrikanische Republik")]
    corpus = [*USED, ("He lives in Zurich.", "Er wohnt in Zürich."),
              ("Zurich is old.", "Zürich ist alt."), ("Off to Zurich!", "Nach Zürich!"),
              ("Vienna's museums.", "Wiens Museen."),  # a possessive: not counted
              ("The Vienna Boys Choir", "Die Wiener Sängerknaben"),  # a longer name: neither
              *[(f"They crossed the Jordan {n}.", f"Sie zogen über den Jordan {n}.")
                for n in range(5)],  # a river, not the country
              ("Jordan is a country.", "Jordanien ist ein Land.")]
    terms = exonym_terms(gazetteer, corpus, min_count=2)
    # Zurich differs by an accent, which counts here; Jordan is mostly the river (1 of 6);
    # Switzerland takes an article and Argostólion is not used.
    assert terms == [("Munich", "München", 2, 1.0), ("Vienna", "Wien", 2, 1.0),
                     ("Zurich", "Zürich", 3, 1.0)]
    assert exonym_terms(gazetteer, corpus, min_count=3) == [("Zurich", "Zürich", 3, 1.0)]


def test_a_bundles_place_names_are_checked_and_read_with_it(tiny_bundle, tmp_path):
    import shutil

    from service.bundle import BundleError, load_bundle

    bundle = tmp_path / "en-de"
    shutil.copytree(tiny_bundle, bundle)
    path = write_bundle_terms(bundle, [("Vienna", "Wien", 2, 1.0)], "made by a test")
    assert path.read_text(encoding="utf-8") == "# made by a test\nVienna\tWien\n"
    assert load_bundle(bundle).terms == {"Vienna": "Wien"}
    path.write_text("Vienna Wien\n", encoding="utf-8")
    with pytest.raises(BundleError, match="sha256 mismatch"):
        load_bundle(bundle)
    with pytest.raises(BundleError, match=r"terms.tsv:1: expected"):
        load_bundle(bundle, verify_checksums=False)


def test_prepare_adds_place_swapped_copies_to_train_only(tmp_path):
    gazetteer = tmp_path / "places.tsv"
    gazetteer.write_text("".join(f"{e}\t{t}\n" for e, t in GAZETTEER), encoding="utf-8")
    trips = tmp_path / "trips.tsv"
    trips.write_text("".join(
        f"Trip {_word(n)} goes to London.\tReise {_word(n)} geht nach London.\n"
        for n in range(30)) + "".join(f"{s}\t{t}\n" for s, t in USED), encoding="utf-8")
    config = _config(tmp_path, SourceFile(str(trips)), SourceFile(str(OVERFIT)), dev_size=5,
                     test_size=5, swap_places=2, place_names=str(gazetteer))
    report = prepare_corpus(config, progress=False)
    splits = _splits(config)
    # The fixture's "lives in Berlin" qualifies too.
    places = [p for p in splits["train"] if p[0].endswith(("to London.", "in Berlin."))]
    swapped = [p for p in splits["train"]
               if p not in USED and any(name in p[1] for name in ("Wien", "München"))]
    assert len(swapped) == 2 * len(places) == report["splits"]["swapped_places"] > 0
    assert ("Trip aaa goes to Vienna.", "Reise aaa geht nach Wien.") in swapped or (
        "Trip aaa goes to Munich.", "Reise aaa geht nach München.") in swapped or (
        ("Trip aaa goes to London.", "Reise aaa geht nach London.") not in splits["train"])
    assert report["splits"]["train_weighted"] == len(splits["train"]) == (
        report["splits"]["train"] + len(swapped))
    held = [p for p in splits["dev"] + splits["test"] if p[0].startswith("Trip ")]
    assert held and all("London" in p[0] for p in held)  # dev and test stay as they were
    assert "with places swapped" in format_report(report)
