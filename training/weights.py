"""Where each of the model's parameters lives outside PyTorch, declared once: in the exported
graphs (``graph_layout``: export writes them, recover reads them back, quantize finds the
weight matrices), in a CTranslate2 model (``ctranslate2_layout``: the importer reads it, the
benchmark's converter writes it) and in a Hugging Face MarianMT checkpoint (``marian_names``).

A ``Stored`` array holds one or more parameters (``training.model.Transformer``'s names)
concatenated along their first axis (an attention's Q, K and V projections; every decoder
layer's cross-attention keys), as a MatMul weight (transposed: [in, out]), as a gather table
(times sqrt(d_model) where the model scales embeddings), or as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from training.config import ModelConfig

PLAIN, MATMUL, TABLE, LOGITS_BIAS = "plain", "matmul", "table", "logits_bias"


@dataclass(frozen=True)
class Stored:
    """One array of a layout and the parameters it holds. ``graph`` names the ONNX graph
    (encoder or decoder) for the graph layout; ``exact`` is false where the array only
    approximates its parameter (a table scaled by an irrational factor, a copy of a parameter
    stored exactly elsewhere), so readers prefer another."""

    name: str
    parts: tuple[str, ...]
    kind: str = PLAIN
    graph: str = ""
    exact: bool = True


def pack(stored: Stored, params: Mapping[str, np.ndarray], config: ModelConfig) -> np.ndarray:
    """The array ``stored`` names, from the parameters."""
    array = np.concatenate([np.asarray(params[part], np.float32) for part in stored.parts])
    if stored.kind == MATMUL:
        return array.T
    if stored.kind == TABLE and config.scale_embeddings:
        return array * np.float32(math.sqrt(config.d_model))
    return array


def unpack(stored: Stored, array: np.ndarray, config: ModelConfig) -> dict[str, np.ndarray]:
    """The parameters ``stored`` holds, from its array (the reverse of ``pack``)."""
    if stored.kind == MATMUL:
        array = array.T
    elif stored.kind == TABLE and config.scale_embeddings:
        array = array / np.float32(math.sqrt(config.d_model))
    return dict(zip(stored.parts, np.split(array, len(stored.parts)), strict=True))


def _linear(name: str, *modules: str, kind: str = MATMUL, graph: str = "",
            bias: str = "bias") -> Iterator[Stored]:
    """A (possibly fused) linear layer: its weight and its bias."""
    yield Stored(f"{name}weight", tuple(f"{m}.weight" for m in modules), kind, graph)
    yield Stored(f"{name}{bias}", tuple(f"{m}.bias" for m in modules), PLAIN, graph)


def _norm(name: str, module: str, gamma: str = "weight", beta: str = "bias",
          graph: str = "") -> Iterator[Stored]:
    yield Stored(f"{name}{gamma}", (f"{module}.weight",), PLAIN, graph)
    yield Stored(f"{name}{beta}", (f"{module}.bias",), PLAIN, graph)


def output_matrix(config: ModelConfig) -> str:
    """The parameter that is the pre-softmax projection: the target embeddings when tied."""
    return "embeddings.lut.weight" if config.tie_output else "output_projection.weight"


def graph_layout(config: ModelConfig) -> list[Stored]:
    """The initialisers ``training.export`` writes into encoder.onnx and decoder.onnx."""
    layout: list[Stored] = []
    enc, dec = "encoder", "decoder"
    # The encoder's table is a copy of the decoder's when the vocabulary is shared.
    scaled_exact = not config.scale_embeddings or math.sqrt(config.d_model).is_integer()
    if config.shared_embeddings:
        layout.append(Stored("embed_table", ("embeddings.lut.weight",), TABLE, enc, False))
    else:
        layout.append(Stored("source_embed_table", ("source_embeddings.lut.weight",), TABLE,
                             enc, scaled_exact))
    for i in range(config.encoder_layers):
        p = f"encoder_layers.{i}."
        layout += _layer(p, config, enc, norms=2)
    if config.pre_norm:
        layout += _norm("encoder_norm.", "encoder_norm", graph=enc)
    for kind in ("keys", "values"):
        modules = [f"decoder_layers.{i}.cross_attn.w_{kind[0]}"
                   for i in range(config.decoder_layers)]
        layout += _linear(f"cross_{kind}.", *modules, graph=enc)

    layout.append(Stored("embed_table", ("embeddings.lut.weight",), TABLE, dec,
                         scaled_exact and not config.tie_output))
    for i in range(config.decoder_layers):
        p = f"decoder_layers.{i}."
        layout += _layer(p, config, dec, norms=3)
        layout += _linear(f"{p}cross_attn.w_q.", f"{p}cross_attn.w_q", graph=dec)
        layout += _linear(f"{p}cross_attn.w_o.", f"{p}cross_attn.w_o", graph=dec)
    if config.pre_norm:
        layout += _norm("decoder_norm.", "decoder_norm", graph=dec)
    layout.append(Stored("generator.weight", (output_matrix(config),), MATMUL, dec))
    if config.output_bias:  # rides on the never-generate mask's Add (export)
        layout.append(Stored("never_generate", ("output_bias",), LOGITS_BIAS, dec))
    return layout


def _layer(p: str, config: ModelConfig, graph: str, norms: int) -> list[Stored]:
    """What encoder and decoder layers store alike: the self-attention (Q, K and V in one
    MatMul), the feed-forward layer, the sublayer norms, and relative position tables."""
    layer = [*_linear(f"{p}self_attn.qkv.", *(f"{p}self_attn.w_{n}" for n in "qkv"),
                      graph=graph),
             *_linear(f"{p}self_attn.w_o.", f"{p}self_attn.w_o", graph=graph),
             *_linear(f"{p}feed_forward.w_1.", f"{p}feed_forward.w_1", graph=graph),
             *_linear(f"{p}feed_forward.w_2.", f"{p}feed_forward.w_2", graph=graph)]
    for norm in range(norms):
        layer += _norm(f"{p}sublayer.{norm}.norm.", f"{p}sublayer.{norm}.norm", graph=graph)
    if config.max_relative_positions:
        layer += [Stored(f"{p}self_attn.{table}", (f"{p}self_attn.{table}",), PLAIN, graph)
                  for table in ("relative_keys", "relative_values")]
    return layer


def matmul_weights(config: ModelConfig, graph: str) -> set[str]:
    """The names of one graph's MatMul weight initialisers (what int8 quantises)."""
    return {s.name for s in graph_layout(config) if s.graph == graph and s.kind == MATMUL}


def ctranslate2_layout(config: ModelConfig) -> list[Stored]:
    """CTranslate2's ``TransformerSpec`` variables of the layers (linear weights [out, in], Q,
    K and V fused in self-attention, K and V in cross-attention; no transposes, no scaling).
    Embeddings, the projection and its bias are the importer's and converter's own: they
    decide sharing, tying and a padding row."""
    layout: list[Stored] = []
    for stack, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        mine = f"{stack}_layers"
        for i in range(layers):
            p, t = f"{mine}.{i}.", f"{stack}/layer_{i}/"
            attention = f"{t}self_attention/"
            layout += _linear(f"{attention}linear_0/", *(f"{p}self_attn.w_{n}" for n in "qkv"),
                              kind=PLAIN)
            layout += _linear(f"{attention}linear_1/", f"{p}self_attn.w_o", kind=PLAIN)
            layout += _norm(f"{attention}layer_norm/", f"{p}sublayer.0.norm", "gamma", "beta")
            if config.max_relative_positions:
                for ours, theirs in (("relative_keys", "relative_position_keys"),
                                     ("relative_values", "relative_position_values")):
                    layout.append(Stored(f"{attention}{theirs}", (f"{p}self_attn.{ours}",)))
            ffn_norm = 1
            if stack == "decoder":
                cross = f"{t}attention/"
                layout += _linear(f"{cross}linear_0/", f"{p}cross_attn.w_q", kind=PLAIN)
                layout += _linear(f"{cross}linear_1/", f"{p}cross_attn.w_k",
                                  f"{p}cross_attn.w_v", kind=PLAIN)
                layout += _linear(f"{cross}linear_2/", f"{p}cross_attn.w_o", kind=PLAIN)
                layout += _norm(f"{cross}layer_norm/", f"{p}sublayer.1.norm", "gamma", "beta")
                ffn_norm = 2
            layout += _linear(f"{t}ffn/linear_0/", f"{p}feed_forward.w_1", kind=PLAIN)
            layout += _linear(f"{t}ffn/linear_1/", f"{p}feed_forward.w_2", kind=PLAIN)
            layout += _norm(f"{t}ffn/layer_norm/", f"{p}sublayer.{ffn_norm}.norm", "gamma",
                            "beta")
        if config.pre_norm:
            layout += _norm(f"{stack}/layer_norm/", f"{stack}_norm", "gamma", "beta")
    return layout


def marian_names(config: ModelConfig) -> dict[str, str]:
    """{our parameter: its name in a Hugging Face MarianMT state dict} for the layers (the
    importer decides embeddings, the output projection and the logits bias)."""
    names: dict[str, str] = {}

    def linear(mine: str, theirs: str) -> None:
        for part in ("weight", "bias"):
            names[f"{mine}.{part}"] = f"{theirs}.{part}"

    def attention(mine: str, theirs: str) -> None:
        for part, name in zip("qkvo", ("q_proj", "k_proj", "v_proj", "out_proj"), strict=True):
            linear(f"{mine}.w_{part}", f"{theirs}.{name}")

    for stack, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            mine, theirs = f"{stack}_layers.{i}", f"model.{stack}.layers.{i}"
            attention(f"{mine}.self_attn", f"{theirs}.self_attn")
            linear(f"{mine}.sublayer.0.norm", f"{theirs}.self_attn_layer_norm")
            last = 1
            if stack == "decoder":
                attention(f"{mine}.cross_attn", f"{theirs}.encoder_attn")
                linear(f"{mine}.sublayer.1.norm", f"{theirs}.encoder_attn_layer_norm")
                last = 2
            linear(f"{mine}.feed_forward.w_1", f"{theirs}.fc1")
            linear(f"{mine}.feed_forward.w_2", f"{theirs}.fc2")
            linear(f"{mine}.sublayer.{last}.norm", f"{theirs}.final_layer_norm")
    return names
