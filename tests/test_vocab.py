import io
from pathlib import Path

import pytest
import sentencepiece as spm

from training.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, VocabConfig
from training.corpus import clean_text, read_pairs, read_tsv
from training.vocab import load_vocab, train_vocab, vocab_coverage

FIXTURES = Path(__file__).parent / "fixtures"
SIZE = 400  # byte fallback and specials take 260 ids, the fixture's characters about 60 more


@pytest.fixture(scope="module")
def train_tsv(tmp_path_factory) -> Path:
    # Cleaned as prepare_corpus would, since the vocabulary relies on that normalisation.
    names = ("overfit.tsv", "shared.tsv", "noisy.tsv")
    pairs = [(clean_text(src), clean_text(tgt)) for name in names
             for src, tgt in read_pairs(str(FIXTURES / name))]
    pairs = [(src, tgt) for src, tgt in pairs if src and tgt]
    path = tmp_path_factory.mktemp("data") / "train.tsv"
    path.write_text("".join(f"{src}\t{tgt}\n" for src, tgt in pairs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model_path(train_tsv, tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("vocab") / "spm"
    return train_vocab(train_tsv, VocabConfig(size=SIZE, model_prefix=str(prefix)))


def test_writes_model_and_vocab(model_path):
    assert model_path.name == "spm.model" and model_path.is_file()
    assert model_path.with_suffix(".vocab").is_file()


def test_special_ids_are_fixed(model_path):
    sp = load_vocab(model_path)
    assert sp.get_piece_size() == SIZE
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]


def test_typical_sentences_round_trip_exactly(model_path, train_tsv):
    sp = load_vocab(model_path)
    sentences = [side for pair in read_tsv(train_tsv) for side in pair] + [
        "„Gänsefüßchen“ und »Guillemets« – mit Gedankenstrich…",
        "Die Datei „{0}“ konnte nicht gespeichert werden: %s (50 %).",
        "Straße, Größe, Übermaß: 1.234,56 € am 3. Oktober 2023.",
        "Press Ctrl+S to save <b>all</b> files & exit.",
    ]
    for text in sentences:
        ids = sp.encode(text)
        assert UNK_ID not in ids
        assert sp.decode(ids) == text


def test_byte_fallback_covers_unseen_characters(model_path):
    sp = load_vocab(model_path)
    for text in ("Grüße 🙂 aus 東京", "emoji 👨\u200d👩\u200d👧 family", "Ωμέγα ǅ ﬁ ²"):
        ids = sp.encode(text)
        assert UNK_ID not in ids
        assert sp.decode(ids) == text
    assert any(sp.is_byte(i) for i in sp.encode("東京"))


def test_digits_are_split(model_path):
    sp = load_vocab(model_path)
    # Only digits seen in the fixture ("30", "40"), so none of them needs byte fallback.
    pieces = [p.lstrip("▁") for p in sp.encode("3040", out_type=str)]
    assert [p for p in pieces if p] == ["3", "0", "4", "0"]


def test_bpe_model_type(train_tsv, tmp_path):
    config = VocabConfig(size=SIZE, model_type="bpe", model_prefix=str(tmp_path / "bpe"))
    sp = load_vocab(train_vocab(train_tsv, config))
    text = "Der Zug hat zwanzig Minuten Verspätung."
    assert sp.decode(sp.encode(text)) == text


def test_too_small_vocab_is_rejected(train_tsv, tmp_path):
    with pytest.raises(ValueError, match="too small"):
        train_vocab(train_tsv, VocabConfig(size=200, model_prefix=str(tmp_path / "x")))


def test_load_vocab_rejects_other_special_ids(train_tsv, tmp_path):
    lines = [side for pair in read_tsv(train_tsv) for side in pair]
    model = io.BytesIO()
    # SentencePiece's defaults: unk=0, bos=1, eos=2, no pad.
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                   vocab_size=SIZE, byte_fallback=True, minloglevel=2)
    path = tmp_path / "default-ids.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(ValueError, match=r"pad=-1 \(expected 0\).*unk=0 \(expected 1\)"):
        load_vocab(path)


def test_load_vocab_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_vocab(tmp_path / "missing.model")


def test_required_chars_and_user_defined_symbols_become_pieces(train_tsv, tmp_path):
    # Neither "€" nor "%d" is in the fixture: without the options "€" is three byte pieces.
    plain = load_vocab(train_vocab(train_tsv, VocabConfig(size=SIZE,
                                                          model_prefix=str(tmp_path / "plain"))))
    euro = [i for i in plain.encode("€") if plain.id_to_piece(i) != "▁"]
    assert [plain.is_byte(i) for i in euro] == [True] * 3
    assert "%d" not in plain.encode("Seite %d", out_type=str)
    config = VocabConfig(size=SIZE, model_prefix=str(tmp_path / "opts"), required_chars="€",
                         user_defined_symbols=["%d"])
    sp = load_vocab(train_vocab(train_tsv, config))
    assert "€" in [sp.id_to_piece(i).lstrip("▁") for i in sp.encode("€")]
    assert "%d" in sp.encode("Seite %d", out_type=str)
    text = "Die Seite %d kostet 30 €."
    assert sp.decode(sp.encode(text)) == text


def test_vocab_coverage_counts_byte_fallback_digits_and_name_pieces(model_path):
    sp = load_vocab(model_path)
    # Only digits seen in the fixture ("30", "40"), so none of them needs byte fallback.
    report = vocab_coverage(sp, ["Berlin 3040 東京", "der Zug"])
    assert report["characters"] == len("Berlin 3040 東京") + len("der Zug")
    # 東京: two characters, neither in the fixture, so both spelled as bytes.
    assert report["byte_fallback_commonest"] == "東京"
    assert report["byte_fallback_chars_per_10k"] == round(1e4 * 2 / report["characters"], 2)
    assert report["digits_as_digit_pieces"] == 1.0

    def pieces(word: str) -> int:
        return len([p for p in sp.encode(word, out_type=str) if p != "▁"])

    assert report["pieces_per_name"] == round((pieces("Berlin") + pieces("Zug")) / 2, 3)
    # "東京" is a word too (letters without case): six byte pieces.
    assert report["pieces_per_word"] == round((pieces("der") + pieces("東京")) / 2, 3)


def test_byte_pieces_that_form_no_character_are_left_out(model_path):
    from service.vocabulary import Vocabulary

    vocabulary = Vocabulary(model_path, unk_id=UNK_ID, eos_id=EOS_ID)
    ids = load_vocab(model_path).encode("東京")
    assert vocabulary.decode(ids) == "東京"
    # The last character cut inside its bytes, as an undertrained model may end one: no U+FFFD.
    assert vocabulary.decode(ids[:-1]) == "東"


def test_a_source_gets_bos_and_eos_as_its_bundle_says(model_path):
    from service.vocabulary import Vocabulary

    special = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
    directory, name = model_path.parent, model_path.name

    def encode(**manifest) -> list[int]:
        vocabulary = Vocabulary.from_manifest(
            directory, {"tokenizer": name, "special_ids": special, **manifest})
        return vocabulary.encode("Good morning.")

    pieces = spm.SentencePieceProcessor(model_file=str(model_path)).encode("Good morning.")
    assert encode() == [*pieces, EOS_ID]  # bundles written before the format was recorded
    assert encode(source_format={"add_bos": False, "add_eos": False}) == pieces
    assert encode(source_format={"add_bos": True, "add_eos": True}) == [BOS_ID, *pieces, EOS_ID]
    # The source's BOS may be another token than the decoder's start.
    assert encode(source_format={"add_bos": True, "add_eos": False},
                  special_ids={**special, "bos": PAD_ID, "source_bos": BOS_ID}) == [
        BOS_ID, *pieces]
    with pytest.raises(ValueError, match="source_format"):
        encode(source_format={"add_eos": "no"})
    with pytest.raises(ValueError, match="source_format"):
        encode(source_format={"add_pad": True})
    # A text of no pieces is never an empty source.
    empty = Vocabulary.from_manifest(directory, {
        "tokenizer": name, "special_ids": special,
        "source_format": {"add_bos": False, "add_eos": False}})
    assert empty.encode("") == [EOS_ID]
