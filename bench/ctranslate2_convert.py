"""Convert one of our training checkpoints into a CTranslate2 model directory.

Used by ``bench/decode.py`` to compare our onnxruntime engine with CTranslate2 on the same
weights. The mapping (checked against ``ctranslate2/specs`` 4.x):

* ``TransformerSpec(TransformerEncoderSpec, TransformerDecoderSpec)`` with ``pre_norm`` as in
  our config and ReLU feed-forward layers. CTranslate2's post-norm layers compute
  LayerNorm(x + Sublayer(x)) like ours; the final encoder/decoder LayerNorm exists only for
  pre-norm, as in our model.
* The layers' variables are where ``training.weights.ctranslate2_layout`` declares them (the
  importer of CTranslate2 models reads the same declaration): self-attention's fused QKV
  linear, cross-attention's query, fused KV and output linears; [out, in] in both libraries.
* Embeddings are multiplied by sqrt(d_model) (``scale_embeddings``, the default). Source, target
  and the output projection share one table; the projection has a zero bias.
* Position encodings are given explicitly: our table, whose row 0 is added to the first token
  (CTranslate2 indexes a supplied table from 0; its built-in table starts at position 1).
* ``layer_norm_epsilon`` and the special tokens are set in the model config.

Run ``python -m bench.ctranslate2_convert CKPT OUT_DIR`` or call :func:`convert`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ctranslate2
import numpy as np
import sentencepiece as spm
import torch
from ctranslate2.specs import common_spec, transformer_spec

from training.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from training.export import load_checkpoint
from training.model import sinusoidal_table
from training.weights import ctranslate2_layout, pack


def _array(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().to(torch.float32).cpu().numpy())


def _variable(spec, name: str):
    """The spec object and attribute a variable name (``encoder/layer_0/ffn/linear_1/bias``)
    addresses: ``layer_0`` is ``layer[0]``, ``linear_0`` ``linear[0]`` where a list holds them."""
    *path, attribute = name.split("/")
    for part in path:
        base, _, index = part.rpartition("_")
        if not hasattr(spec, part) and base and index.isdigit() and hasattr(spec, base):
            spec = getattr(spec, base)[int(index)]
        else:
            spec = getattr(spec, part)
    return spec, attribute


def build_spec(model, checkpoint: dict) -> transformer_spec.TransformerSpec:
    """The CTranslate2 spec of ``model`` (a ``training.model.Transformer``)."""
    config = model.config
    state = {k: v for k, v in model.state_dict().items()}
    relu = common_spec.Activation.RELU
    encoder = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.heads, pre_norm=config.pre_norm, activation=relu
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.heads, pre_norm=config.pre_norm, activation=relu
    )

    embedding = _array(state["embeddings.lut.weight"])
    # Row p of our table is added to the token at position p (the decoder's BOS is at 0).
    positions = _array(sinusoidal_table(config.max_positions, config.d_model))
    for stack in (encoder, decoder):
        stack.scale_embeddings = True  # x * sqrt(d_model), as training.model.Embeddings
        stack.position_encodings.encodings = positions
    encoder.embeddings[0].weight = embedding
    decoder.embeddings.weight = embedding
    decoder.projection.weight = embedding  # tied generator (§3.4), no bias in our model
    decoder.projection.bias = np.zeros(config.vocab_size, np.float32)

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    params = {name: _array(tensor) for name, tensor in state.items()}
    for stored in ctranslate2_layout(config):  # the layers, as training.weights declares them
        owner, attribute = _variable(spec, stored.name)
        setattr(owner, attribute, np.ascontiguousarray(pack(stored, params, config)))
    pieces = _vocabulary(Path(checkpoint["vocab"]), config.vocab_size)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.config.unk_token = pieces[UNK_ID]
    spec.config.bos_token = pieces[BOS_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.decoder_start_token = pieces[BOS_ID]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False  # callers pass pieces + "</s>", as Engine.tokenize
    return spec


def _vocabulary(path: Path, size: int) -> list[str]:
    sp = spm.SentencePieceProcessor(model_file=str(path))
    if sp.get_piece_size() != size:
        raise ValueError(f"{path} has {sp.get_piece_size()} pieces, the model {size}")
    ids = {"pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id()}
    if ids != {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}:
        raise ValueError(f"{path}: special ids {ids} differ from training.config")
    pieces = [sp.id_to_piece(i) for i in range(size)]
    if len(set(pieces)) != size:
        raise ValueError(f"{path}: duplicate pieces; CTranslate2 needs a 1:1 vocabulary")
    return pieces


def convert(
    checkpoint_path: str | Path, out_dir: str | Path, quantization: str | None = None
) -> Path:
    """Write a CTranslate2 model of ``checkpoint_path`` to ``out_dir`` (replaced) and return it.

    ``quantization`` is stored in the model (e.g. "int8"); leave it None to store float32 and
    choose ``compute_type`` when loading the translator."""
    model, checkpoint = load_checkpoint(checkpoint_path)
    spec = build_spec(model, checkpoint)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(out_dir))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("out_dir")
    parser.add_argument("--quantization", default=None, help="e.g. int8 (default: float32)")
    args = parser.parse_args(argv)
    path = convert(args.checkpoint, args.out_dir, args.quantization)
    print(f"wrote {path} (ctranslate2 {ctranslate2.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
