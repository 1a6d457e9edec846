"""Hugging Face MarianMT directories (Helsinki-NLP's Opus-MT and Tatoeba-Challenge models).

Marian's Transformer is the paper's post-norm model with swish (or another) activation,
[sin | cos] position halves starting at 0, embeddings scaled by sqrt(d_model), a logits bias,
and a decoder that starts from the pad token (whose embedding row is zero). Its ids are those
of ``vocab.json``: two SentencePiece models (``source.spm``, ``target.spm``) only cut the text
into pieces. Weight names follow ``transformers``' ``MarianMTModel``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from training.config import ModelConfig
from training.importers import Imported, UnsupportedModel, language_tokens
from training.model import Transformer
from training.weights import marian_names

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def recognise(path: Path) -> bool:
    if not (path / "config.json").is_file():
        return False
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return config.get("model_type") == "marian"


def _require(condition: bool, path: Path, feature: str) -> None:
    if not condition:
        raise UnsupportedModel(f"{path}: uses {feature}, which this model does not support")


def _state(path: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHTS:
        file = path / name
        if not file.is_file():
            continue
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(str(file))
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
        # Older checkpoints save the inner model's names without the "model." prefix.
        return {key if key.startswith(("model.", "lm_head", "final_logits")) else f"model.{key}":
                value.float() for key, value in state.items()}
    raise UnsupportedModel(f"{path}: no weights ({' or '.join(WEIGHTS)})")


def _model_config(path: Path, hf: dict[str, Any]) -> ModelConfig:
    _require(hf.get("encoder_attention_heads") == hf.get("decoder_attention_heads"), path,
             "different encoder and decoder head counts")
    _require(hf.get("encoder_ffn_dim") == hf.get("decoder_ffn_dim"), path,
             "different encoder and decoder feed-forward widths")
    activation = hf.get("activation_function", "swish")
    _require(activation in ACTIVATIONS, path, f"the activation {activation!r}")
    _require(not hf.get("normalize_before", False), path, "pre-norm layers")
    _require(not hf.get("normalize_embedding", False), path, "a layer norm on the embeddings")
    _require(hf.get("static_position_embeddings", True), path, "learned position embeddings")
    vocab_size = hf["vocab_size"]
    decoder_vocab = hf.get("decoder_vocab_size") or vocab_size
    shared = hf.get("share_encoder_decoder_embeddings", True)
    _require(shared or decoder_vocab is not None, path, "separate vocabularies without sizes")
    return ModelConfig(
        d_model=hf["d_model"], d_ff=hf["encoder_ffn_dim"], heads=hf["encoder_attention_heads"],
        encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"], dropout=0.0,
        vocab_size=decoder_vocab, source_vocab_size=0 if shared else vocab_size,
        max_positions=hf.get("max_position_embeddings", 512), pre_norm=False,
        layer_norm_eps=1e-5,  # torch.nn.LayerNorm's default, which MarianMTModel uses
        activation=ACTIVATIONS[activation], position_layout="halves", position_offset=0,
        scale_embeddings=bool(hf.get("scale_embedding", True)), shared_embeddings=shared,
        tie_output=True, output_bias=True, pad_id=hf["pad_token_id"],
        unk_id=1,  # replaced by vocab.json's <unk> below
        bos_id=hf.get("decoder_start_token_id", hf["pad_token_id"]), eos_id=hf["eos_token_id"],
    )


def _weights(state: dict[str, torch.Tensor], config: ModelConfig, path: Path) -> dict:
    ours: dict[str, torch.Tensor] = {}
    target = state.get("model.decoder.embed_tokens.weight", state.get("model.shared.weight"))
    source = state.get("model.encoder.embed_tokens.weight", state.get("model.shared.weight"))
    if target is None or source is None:
        raise UnsupportedModel(f"{path}: no embedding matrix in the weights")
    ours["embeddings.lut.weight"] = target
    if not config.shared_embeddings:
        ours["source_embeddings.lut.weight"] = source
    head = state.get("lm_head.weight")
    if head is not None and not torch.equal(head, target):
        config.tie_output = False
        ours["output_projection.weight"] = head
    ours["output_bias"] = state.get("final_logits_bias",
                                    torch.zeros(1, config.vocab_size)).reshape(-1)
    for mine, theirs in marian_names(config).items():  # the layers (training.weights)
        if theirs not in state:
            raise UnsupportedModel(f"{path}: no {theirs} in the weights")
        ours[mine] = state[theirs]
    return ours


def _pieces(file: Path) -> list[str]:
    """vocab.json ({piece: id}) as a list whose index is the id."""
    mapping: dict[str, int] = json.loads(file.read_text(encoding="utf-8"))
    pieces = [""] * (max(mapping.values()) + 1)
    for piece, index in mapping.items():
        pieces[index] = piece
    return pieces


def read(path: Path) -> Imported:
    hf = json.loads((path / "config.json").read_text(encoding="utf-8"))
    config = _model_config(path, hf)
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (path / name).is_file():
            raise UnsupportedModel(f"{path}: no {name} (MarianMT's tokenizer files)")
    source_pieces = _pieces(path / "vocab.json")
    target_file = path / "target_vocab.json"
    target_pieces = _pieces(target_file) if target_file.is_file() else source_pieces
    _require(config.shared_embeddings == (target_pieces is source_pieces), path,
             "separate vocabularies in shared embeddings (or the reverse)")
    if "<unk>" not in source_pieces:
        raise UnsupportedModel(f"{path}: vocab.json has no <unk>")
    config.unk_id = source_pieces.index("<unk>")
    for side, pieces in (("source", source_pieces), ("target", target_pieces)):
        if len(pieces) > (config.src_vocab_size if side == "source" else config.vocab_size):
            raise UnsupportedModel(f"{path}: the {side} vocabulary is larger than the model's")
    weights = _weights(_state(path), config, path)  # settles config.tie_output first
    model = Transformer(config)
    model.load_state_dict(weights, strict=True)
    tokenizer_config: dict[str, Any] = {}
    if (path / "tokenizer_config.json").is_file():
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text("utf-8"))
    return Imported(
        model=model.eval(),
        source_tokenizer=path / "source.spm",
        target_tokenizer=path / "target.spm",
        vocabulary={"source": source_pieces, "target": target_pieces},
        source_lang=tokenizer_config.get("source_lang"),
        target_lang=tokenizer_config.get("target_lang"),
        target_languages=language_tokens(source_pieces),
        origin={"format": "huggingface-marian", "path": str(path),
                "name_or_path": hf.get("_name_or_path", "")},
    )
