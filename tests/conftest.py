"""Shared pytest fixtures. Each block belongs to one area; keep additions in their own block."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

# =============================================================================================
# training: a vocabulary and a tiny-preset config on the overfit fixture
# (used by tests/test_model.py and tests/test_train.py)
# =============================================================================================

TRAIN_FIXTURES = Path(__file__).parent / "fixtures"
OVERFIT_TSV = TRAIN_FIXTURES / "overfit.tsv"
OVERFIT_VOCAB_SIZE = 500


@pytest.fixture(scope="session")
def overfit_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece model trained once per session on both sides of the overfit fixture."""
    from training.config import VocabConfig
    from training.vocab import train_vocab

    prefix = tmp_path_factory.mktemp("overfit_vocab") / "spm"
    return train_vocab(OVERFIT_TSV, VocabConfig(size=OVERFIT_VOCAB_SIZE, model_prefix=str(prefix)))


@pytest.fixture
def make_train_config(tmp_path: Path, overfit_vocab: Path) -> Callable:
    """Factory for a tiny-preset Config whose train and dev splits are the overfit fixture;
    ``make_train_config("train.max_steps=5", out="run_a")`` (extra ``section.field=value``
    overrides; ``out`` names the run directory under the test's tmp_path)."""
    from training.config import load_config

    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for split in ("train", "dev"):
        shutil.copyfile(OVERFIT_TSV, data / f"{split}.tsv")

    def make(*overrides: str, out: str = "run"):
        base = [
            'model.preset="tiny"',
            f"model.vocab_size={OVERFIT_VOCAB_SIZE}",
            f"data.out_dir={data}",
            f"vocab.model_prefix={overfit_vocab.with_suffix('')}",
            f"train.out_dir={tmp_path / out}",
            "train.threads=1",
            'train.precision="fp32"',  # the same arithmetic on every CI machine
            "train.batch_tokens=4000",
            "train.log_every=10",
            "train.validate_every=100000",
            "train.checkpoint_every=100000",
            "train.dev_bleu_sentences=8",
        ]
        return load_config(None, [*base, *overrides])

    return make


# =============================================================================================
# end of the training block
# =============================================================================================

# =============================================================================================
# engine and service: a tiny model that has memorised the overfit fixture, exported once
# (used by tests/test_export.py, tests/test_decoding.py, tests/test_api.py, ...)
# =============================================================================================


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, overfit_vocab: Path) -> Path:
    """Train the tiny preset on the overfit fixture until greedy decoding reproduces every
    target; return its last checkpoint."""
    import torch

    from training.config import BOS_ID, EOS_ID, PAD_ID, load_config
    from training.model import Transformer
    from training.train import train

    root = tmp_path_factory.mktemp("tiny_model")
    data = root / "data"
    data.mkdir()
    for split in ("train", "dev"):
        shutil.copyfile(OVERFIT_TSV, data / f"{split}.tsv")
    config = load_config(None, [
        'model.preset="tiny"', f"model.vocab_size={OVERFIT_VOCAB_SIZE}",
        f"data.out_dir={data}", f"vocab.model_prefix={overfit_vocab.with_suffix('')}",
        f"train.out_dir={root / 'train'}", "train.threads=1", 'train.precision="fp32"',
        "train.batch_tokens=4000",
        "train.warmup_steps=50", "train.label_smoothing=0.0", "train.clip_norm=0.0",
        "train.validate_every=100000", "train.checkpoint_every=100000", "train.log_every=50",
        "train.dev_bleu_sentences=8",
    ])
    from training.export import load_checkpoint
    from training.vocab import load_vocab

    sp = load_vocab(overfit_vocab)
    pairs = [line.split("\t") for line in OVERFIT_TSV.read_text(encoding="utf-8").splitlines()]
    rows = [[*sp.encode(src), EOS_ID] for src, _ in pairs]
    src = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        src[i, : len(row)] = torch.tensor(row)
    targets = [sp.encode(tgt) for _, tgt in pairs]
    checkpoint = root / "train" / "checkpoint_last.pt"
    # Exact at 150-400 on the machines seen so far (500 on one Intel Xeon with AMX: float
    # rounding differs by CPU); resume until it is.
    for steps in (200, 300, 400, 500, 600, 800):
        config.train.max_steps = steps
        train(config, resume=steps > 200)
        model, _ = load_checkpoint(checkpoint)
        assert isinstance(model, Transformer)
        if model.greedy_decode(src, 60, BOS_ID, EOS_ID) == targets:
            return checkpoint
    raise AssertionError("the tiny model did not memorise the fixture in 800 steps")


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model exported (fp32 + int8) as an ``en-de`` bundle."""
    from training.export import export_bundle

    out = tmp_path_factory.mktemp("models") / "en-de"
    return export_bundle(tiny_checkpoint, out, int8=True)


# =============================================================================================
# importers: a tiny MarianMT model built with transformers, as Opus-MT publishes them
# (used by tests/test_importers.py)
# =============================================================================================

MARIAN_LANGUAGES = (">>deu<<", ">>ltz<<")  # a multilingual model's target-language tokens


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MarianMTModel (swish, a non-zero logits bias, two target-language tokens) trained
    on the overfit fixture until it translates it, saved with its tokenizer files."""
    import json

    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out = tmp_path_factory.mktemp("marian")
    pairs = [line.split("\t") for line in OVERFIT_TSV.read_text(encoding="utf-8").splitlines()]
    for side, column in (("source", 0), ("target", 1)):
        text = out / f"{side}.txt"
        text.write_text("\n".join(pair[column] for pair in pairs) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(out / side), vocab_size=200, model_type="unigram",
            character_coverage=1.0, unk_id=0, eos_id=1, bos_id=-1, pad_id=-1,
            minloglevel=2)
        (out / f"{side}.model").rename(out / f"{side}.spm")
    # Marian's joint vocabulary: </s>, <unk>, the language tokens, both models' pieces, <pad>.
    pieces = ["</s>", "<unk>", *MARIAN_LANGUAGES]
    for side in ("source", "target"):
        model = spm.SentencePieceProcessor(model_file=str(out / f"{side}.spm"))
        for i in range(model.get_piece_size()):
            if model.id_to_piece(i) not in pieces and not model.is_control(i):
                pieces.append(model.id_to_piece(i))
    pieces.append("<pad>")
    vocab = {piece: i for i, piece in enumerate(pieces)}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de"}), encoding="utf-8")
    tokenizer = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"),
                                str(out / "vocab.json"), source_lang="en", target_lang="de")
    size, pad = len(pieces), len(pieces) - 1
    config = MarianConfig(
        vocab_size=size, decoder_vocab_size=size, d_model=64, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, activation_function="swish",
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        max_position_embeddings=128, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0)
    torch.manual_seed(0)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        model.model.shared.weight[pad].zero_()
    sources = [f"{MARIAN_LANGUAGES[0]} {src}" for src, _ in pairs]
    batch = tokenizer(sources, text_target=[tgt for _, tgt in pairs], padding=True,
                      return_tensors="pt")
    labels = batch["labels"].masked_fill(batch["labels"] == pad, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    # Opus-MT's pad row is zero (its decoder starts from a zero embedding, as Marian's and
    # CTranslate2's do): keep it so although the tied output projection trains the matrix.
    model.model.shared.weight.register_hook(lambda grad: grad.index_fill(0, torch.tensor([pad]),
                                                                         0.0))
    model.train()
    for _ in range(300):
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    return out / "model"


# =============================================================================================
# end of the importers block
# =============================================================================================
