"""A MarianMT directory of Opus-MT's size with random weights, for speed comparisons of an
imported model (``bench/decode.py --import``): what a Helsinki-NLP download looks like, built
here, since none can be downloaded.

    python bench/random_marian.py OUT --text TEST.tsv [--preset base] [--vocab 58101]

Source and target SentencePiece models are trained on the source and target columns of
``--text``; ``vocab.json`` holds their pieces, then filler pieces up to ``--vocab`` entries,
so the output projection is as wide as a real model's (Opus-MT's en-de: 58,101). The pad row
is zero (as in Opus-MT: the decoder starts from a zero embedding) and the logits bias is
random (``--bias-std``: how peaked the next-token distributions are). A script that builds
a fixture for a benchmark; nothing in it is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

PRESETS = {  # Transformer-base as Opus-MT trains it, and Transformer-big (Tatoeba's "big")
    "base": dict(d_model=512, heads=8, ffn=2048, layers=6),
    "big": dict(d_model=1024, heads=16, ffn=4096, layers=6),
}


def build(out: Path, text: Path, preset: str = "base", vocab_size: int = 58101,
          seed: int = 0, bias_std: float = 0.1, eos_bias: float = 0.0) -> Path:
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        columns = [line.rstrip("\n").split("\t") for line in text.open(encoding="utf-8")]
        for side, column in (("source", 0), ("target", 1)):
            sentences = Path(tmp) / f"{side}.txt"
            sentences.write_text("\n".join(row[min(column, len(row) - 1)] for row in columns),
                                 encoding="utf-8")
            spm.SentencePieceTrainer.train(
                input=str(sentences), model_prefix=str(out / side), vocab_size=4000,
                model_type="unigram", character_coverage=1.0, unk_id=0, eos_id=1, bos_id=-1,
                pad_id=-1, minloglevel=2)
            (out / f"{side}.model").rename(out / f"{side}.spm")
    pieces = ["</s>", "<unk>"]
    for side in ("source", "target"):
        model = spm.SentencePieceProcessor(model_file=str(out / f"{side}.spm"))
        pieces += [model.id_to_piece(i) for i in range(model.get_piece_size())
                   if not model.is_control(i) and not model.is_unknown(i)
                   and model.id_to_piece(i) not in pieces]
    pieces += [f"▁filler{i}" for i in range(vocab_size - 1 - len(pieces))] + ["<pad>"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "xx", "target_lang": "yy"}), encoding="utf-8")
    size = dict(PRESETS[preset])
    pad = len(pieces) - 1
    config = MarianConfig(
        vocab_size=len(pieces), decoder_vocab_size=len(pieces), d_model=size["d_model"],
        encoder_layers=size["layers"], decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"], decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["ffn"], decoder_ffn_dim=size["ffn"], activation_function="swish",
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        max_position_embeddings=512, scale_embedding=True)
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.model.shared.weight[pad].zero_()
        model.final_logits_bias.normal_(0.0, bias_std)
        model.final_logits_bias[0, 0] += eos_bias  # </s> (id 0)
    model.save_pretrained(out)
    MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                    source_lang="xx", target_lang="yy").save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--text", type=Path, required=True,
                        help="TSV (source<TAB>target) to train the SentencePiece models on")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="base")
    parser.add_argument("--vocab", type=int, default=58101)
    parser.add_argument("--bias-std", type=float, default=0.1,
                        help="spread of the random logits bias: 0.1 leaves every step's "
                        "distribution nearly flat (the worst case for a search that scans the "
                        "best candidates only), 3 makes it peaked as a trained model's are")
    parser.add_argument("--eos-bias", type=float, default=0.0,
                        help="added to </s>'s logits bias: a random model otherwise rarely "
                        "stops before its length cap, where engines that cap differently "
                        "would do different work; with it, sentences end at lengths a "
                        "served model's do")
    args = parser.parse_args(argv)
    print(build(args.out, args.text, args.preset, args.vocab, bias_std=args.bias_std,
                eos_bias=args.eos_bias))
    return 0


if __name__ == "__main__":
    sys.exit(main())
