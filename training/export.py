"""Turn a checkpoint into a self-contained bundle that ``service/`` runs without torch.

The bundle holds the two graphs of the ONNX contract (v4, see ``service/bundle.py``), the
SentencePiece model and ``manifest.json``. Before anything is written the exported graphs are
run on onnxruntime against PyTorch over padded batches and several decoding steps; a bundle
that disagrees is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch import Tensor

from service.bundle import (
    CACHE_INPUTS,
    CONTRACT_VERSION,
    DECODING_KEYS,
    MANIFEST,
    decoder_feeds,
    decoder_inputs,
    decoder_outputs,
    sha256_file,
)
from service.engine import DISABLED_OPTIMIZERS
from service.normalize import clean_text
from service.search import DecodeOptions
from service.vocabulary import Vocabulary
from training.config import ModelConfig
from training.fp16 import checked_fp16
from training.model import Transformer
from training.quantize import calibration_sources, quantize_int8, vocabulary_sources
from training.weights import graph_layout, pack

log = logging.getLogger(__name__)

OPSET = 18
PARITY_ATOL = 1e-4


def cross_last(keys: Tensor, values: Tensor, src_mask: Tensor) -> Tensor:
    """[batch, 1, layers * 2 * d_model]: each row's cross key and value at its last real
    source position (position 0 for a row with none), layer by layer, key before value: the
    encoder graph's fourth output, computed from ``Transformer.encode_cross``'s for parity."""
    layers, batch, heads, _, head_dim = keys.shape
    last = (src_mask.sum(-1).clamp(min=1) - 1).view(1, batch, 1, 1, 1)
    index = last.expand(layers, batch, heads, 1, head_dim)
    pairs = torch.stack([keys.gather(3, index), values.gather(3, index)], dim=1)
    # [layers, 2, batch, heads, 1, head_dim] -> [batch, 1, layers, 2, heads, head_dim]
    return pairs.permute(2, 4, 0, 1, 3, 5).reshape(batch, 1, layers * 2 * heads * head_dim)


def load_checkpoint(path: str | Path) -> tuple[Transformer, dict[str, Any]]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    config = ModelConfig(**checkpoint["model_config"])
    model = Transformer(config)
    model.load_state_dict(checkpoint["model"])
    return model.eval(), checkpoint


def export_graphs(model: Transformer, out_dir: Path) -> None:
    """Write encoder.onnx and decoder.onnx, both built node by node (``_fused_encoder_graph``,
    ``_fused_decoder_graph``) with dynamic batch, source and cache lengths."""
    import onnx

    model.eval()  # the parity check that follows runs it: dropout off
    onnx.save(_fused_encoder_graph(model), out_dir / "encoder.onnx")
    onnx.save(_fused_decoder_graph(model), out_dir / "decoder.onnx")


def _value_info(name: str, dtype: int, shape: list):
    from onnx import helper

    return helper.make_tensor_value_info(name, dtype, shape)


class _GraphBuilder:
    """Nodes and named initialisers of a hand-built graph (``graph``: encoder or decoder) of
    onnxruntime's fused CPU kernels, with the model's weights at hand. Every weight goes in
    as ``training.weights.graph_layout`` declares it (``stored``), which is what
    ``training.recover`` reads back."""

    def __init__(self, model: Transformer, graph: str):
        self.config = model.config
        self.state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
        self.layout = {s.name: s for s in graph_layout(model.config) if s.graph == graph}
        self.inits: list = []
        self.nodes: list = []

    def stored(self, name: str) -> str:
        """The initialiser ``name`` of the layout, packed from the model's weights."""
        return self.const(name, pack(self.layout[name], self.state, self.config))

    def const(self, name: str, array) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], domain: str = "",
             **attrs) -> str:
        from onnx import helper

        self.nodes.append(
            helper.make_node(op, inputs, outputs, name=outputs[0], domain=domain, **attrs)
        )
        return outputs[0]

    def embedding_tables(self, model: Transformer, source: bool = False) -> str:
        """The scaled embeddings a graph gathers from (§3.4) and ``position_table`` (§3.5);
        returns the table's name: ``embed_table`` (the target's, and the source's when
        shared) or, for the encoder of a model with separate vocabularies,
        ``source_embed_table``."""
        separate = source and not self.config.shared_embeddings
        name = self.stored("source_embed_table" if separate else "embed_table")
        self.const("position_table", model.positional.table.float().numpy())
        return name

    def weight(self, prefix: str) -> str:  # nn.Linear keeps [out, in]; MatMul wants [in, out]
        return self.stored(prefix + "weight")

    def bias(self, name: str) -> str:
        return self.stored(name)

    def layer_norm(self, prefix: str, x: str, out: str) -> str:
        return self.node("LayerNormalization",
                         [x, self.bias(prefix + "weight"), self.bias(prefix + "bias")],
                         [out], axis=-1, epsilon=float(self.config.layer_norm_eps))

    def sublayer(self, layer: str, norm: int, x: str, name: str, body) -> str:
        """AddNorm around ``body(input) -> (output, output bias)``: post-norm
        LayerNorm(x + output + bias), as two Adds and a ``LayerNormalization`` (onnxruntime's
        fused CPU ``SkipLayerNormalization`` is slower at every row count, docs/benchmarks.md),
        or pre-norm x + body(LayerNorm(x))."""
        norm_prefix = f"{layer}sublayer.{norm}.norm."
        pre_norm = self.config.pre_norm
        out, bias = body(self.layer_norm(norm_prefix, x, f"{name}_normed") if pre_norm else x)
        biased = self.node("Add", [out, self.bias(bias)], [f"{name}_biased"])
        residual = self.node("Add", [x, biased], [f"{name}_residual"])
        return residual if pre_norm else self.layer_norm(norm_prefix, residual, f"{name}_norm")

    def qkv(self, prefix: str, y: str, i: int) -> str:
        """One MatMul (and bias) for an attention's queries, keys and values: [.., 3 * d]."""
        product = self.node("MatMul", [y, self.stored(prefix + "qkv.weight")],
                            [f"qkv_nobias_{i}"])
        return self.node("Add", [product, self.stored(prefix + "qkv.bias")], [f"qkv_{i}"])

    def feed_forward(self, f: str, y: str, i: int) -> tuple[str, str]:
        hidden = self.node("MatMul", [y, self.weight(f + "w_1.")], [f"ffn_hidden_nobias_{i}"])
        hidden = self.node("Add", [hidden, self.bias(f + "w_1.bias")], [f"ffn_pre_{i}"])
        hidden = self.activation(hidden, f"ffn_hidden_{i}")
        out = self.node("MatMul", [hidden, self.weight(f + "w_2.")], [f"ffn_out_{i}"])
        return out, f + "w_2.bias"

    def activation(self, x: str, out: str) -> str:
        """The feed-forward activation: ReLU (§3.3), GELU (erf, onnxruntime's fused kernel)
        or swish, x * sigmoid(x)."""
        kind = self.config.activation
        if kind == "relu":
            return self.node("Relu", [x], [out])
        if kind == "gelu":
            return self.node("Gelu", [x], [out], domain="com.microsoft")
        return self.node("Mul", [x, self.node("Sigmoid", [x], [f"{out}_gate"])], [out])

    def model(self, name: str, inputs: list, outputs: list):
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        return helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET),
                           helper.make_opsetid("com.microsoft", 1)],
            ir_version=9,  # onnxruntime reads up to IR 10; onnx's default may be newer
            producer_name="training.export",
        )


def plain_encoder_inputs(g: _GraphBuilder, config: ModelConfig, src_len: str) -> None:
    """What every encoder layer's plain attention shares: the scale, the head shapes, the
    key padding as a mask, and for relative positions each (query, key) pair's table row."""
    node = g.node
    g.const("attention_scale", np.array(config.head_dim ** -0.5, np.float32))
    g.const("masked_score", np.array(np.finfo(np.float32).min, np.float32))
    g.const("encoder_head_shape", np.array([0, 0, config.heads, config.head_dim], np.int64))
    g.const("encoder_merged_shape", np.array([0, 0, config.d_model], np.int64))
    g.const("key_mask_shape", np.array([0, 1, 1, -1], np.int64))
    node("Reshape", ["src_mask", "key_mask_shape"], ["encoder_seen"])  # [batch, 1, 1, len]
    if config.max_relative_positions:
        length = node("Squeeze", [src_len], ["src_len_scalar"])
        g.const("zero_scalar", np.array(0, np.int64))
        positions = node("Range", ["zero_scalar", length, "one"], ["src_positions"])
        distance = node("Sub", [node("Unsqueeze", [positions, "zero"], ["key_positions"]),
                                node("Unsqueeze", [positions, "axis1"], ["query_positions"])],
                        ["encoder_distance"])  # [len, len]: key minus query
        node("Add", [relative_distance(g, distance, config), "max_relative"],
             ["encoder_relative_index"])


def plain_encoder_attention(g: _GraphBuilder, config: ModelConfig, q: str, k: str, v: str,
                            i: int, prefix: str) -> str:
    """MultiHeadAttention over the key padding in plain operators, with relative positions
    where the model has them: their terms are products of each query position with its own
    row of relative vectors, so positions go first for those MatMuls ([len, batch*heads, .])."""
    node = g.node
    name = f"encoder_{i}"

    def heads(x: str) -> str:  # [batch, len, d] -> [batch, heads, len, head_dim]
        return node("Transpose", [node("Reshape", [x, "encoder_head_shape"], [f"{x}_split"])],
                    [f"{x}_heads"], perm=[0, 2, 1, 3])

    qh, kh, vh = heads(q), heads(k), heads(v)
    dots = node("MatMul", [qh, node("Transpose", [kh], [f"{name}_keys_t"], perm=[0, 1, 3, 2])],
                [f"{name}_dots"])
    if config.max_relative_positions:
        rel_keys, rel_values = _relative_tables(g, prefix, "encoder_relative_index", name)
        g.const("by_position", np.array([0, -1, config.head_dim], np.int64))
        by_position = node("Reshape", [node("Transpose", [qh], [f"{name}_q_t"],
                                            perm=[2, 0, 1, 3]), "by_position"],
                           [f"{name}_q_by_position"])  # [len, batch*heads, head_dim]
        rel = node("MatMul", [by_position, node("Transpose", [rel_keys], [f"{name}_rk_t"],
                                                perm=[0, 2, 1])], [f"{name}_rel_dots_t"])
        dots = node("Add", [dots, _unfold(g, rel, f"{name}_rel_dots")], [f"{name}_all_dots"])
    scores = node("Mul", [dots, "attention_scale"], [f"{name}_scores"])
    masked = node("Where", ["encoder_seen", scores, "masked_score"], [f"{name}_masked"])
    probs = node("Softmax", [masked], [f"{name}_probs"], axis=-1)
    context = node("MatMul", [probs, vh], [f"{name}_context_h"])
    if config.max_relative_positions:
        p_t = node("Transpose", [probs], [f"{name}_p_t"], perm=[2, 0, 1, 3])
        shape = node("Concat", [g.const("zero_minus_one", np.array([0, -1], np.int64)),
                                node("Shape", [p_t], [f"{name}_keys_len"], start=3, end=4)],
                     [f"{name}_p_shape"], axis=0)
        p_by_position = node("Reshape", [p_t, shape],
                             [f"{name}_p_by_position"])  # [len, batch*heads, len]
        rel = node("MatMul", [p_by_position, rel_values], [f"{name}_rel_context_t"])
        context = node("Add", [context, _unfold(g, rel, f"{name}_rel_context")],
                       [f"{name}_all_context"])
    context = node("Transpose", [context], [f"{name}_context_t"], perm=[0, 2, 1, 3])
    return node("Reshape", [context, "encoder_merged_shape"], [f"context_{i}"])


def _unfold(g: _GraphBuilder, x: str, name: str) -> str:
    """[len, batch*heads, n] -> [batch, heads, len, n]: the products by position, back."""
    shape = g.node("Concat", [g.node("Shape", [x], [f"{name}_len"], start=0, end=1),
                              g.const("minus_one_heads", np.array([-1, g.config.heads],
                                                                  np.int64)),
                              g.node("Shape", [x], [f"{name}_n"], start=2, end=3)],
                   [f"{name}_shape"], axis=0)
    return g.node("Transpose", [g.node("Reshape", [x, shape], [f"{name}_4d"])], [name],
                  perm=[1, 2, 0, 3])



def _fused_encoder_graph(model: Transformer):
    """The encoder and every decoder layer's cross-attention keys/values as a hand-built graph
    of onnxruntime's fused kernels: the maths of ``Transformer.encode_cross`` (and
    ``cross_last``) in 85 nodes where the traced graph had 388, most of them shape
    arithmetic and transposes that cost more than the products at the batch sizes a server
    encodes (one to a few sentences at a time).

    Self-attention is ``com.microsoft.MultiHeadAttention`` over a key padding mask; Add &
    Norm is unfused (see ``_GraphBuilder.sublayer``): the encoder's products have a row per
    source token. All decoder layers' cross keys come from one MatMul, and values from
    another."""
    from onnx import TensorProto

    g = _GraphBuilder(model, "encoder")
    config = g.config
    heads, d_model, head_dim = config.heads, config.d_model, config.head_dim
    layers = config.decoder_layers
    table = g.embedding_tables(model, source=True)
    g.const("axis1", np.array([1], np.int64))
    g.const("zero", np.array([0], np.int64))
    g.const("one", np.array(1, np.int64))
    src_mask = g.node("Not", [g.node("Equal", ["src_tokens", g.const(
        "pad_id", np.array(config.pad_id, np.int64))], ["is_pad"])], ["src_mask"])
    key_padding = g.node("Cast", [src_mask], ["key_padding_mask"], to=TensorProto.INT32)
    src_len = g.node("Shape", ["src_tokens"], ["src_len"], start=1, end=2)
    positions = g.node("Slice", ["position_table", "zero", src_len, "zero"],
                       ["position_encoded"])
    x = g.node("Add", [g.node("Gather", [table, "src_tokens"], ["embedded"]),
                       positions], ["x_0"])
    plain = not fused_attention_fits(config)
    if plain:
        plain_encoder_inputs(g, config, src_len)

    for i in range(config.encoder_layers):
        p = f"encoder_layers.{i}."

        def self_attention(y: str, i=i, a=p + "self_attn.") -> tuple[str, str]:
            q, k, v = (f"{part}_{i}" for part in "qkv")
            g.node("Split", [g.qkv(a, y, i)], [q, k, v], axis=2, num_outputs=3)
            if plain:
                context = plain_encoder_attention(g, config, q, k, v, i, a)
            else:
                context = g.node("MultiHeadAttention", [q, k, v, "", key_padding],
                                 [f"context_{i}"], domain="com.microsoft", num_heads=heads)
            out = g.node("MatMul", [context, g.weight(a + "w_o.")], [f"self_out_{i}"])
            return out, a + "w_o.bias"

        x = g.sublayer(p, 0, x, f"self_{i}", self_attention)
        x = g.sublayer(p, 1, x, f"ffn_{i}",
                       lambda y, i=i, f=p + "feed_forward.": g.feed_forward(f, y, i))
    if config.pre_norm:  # the pre-norm stack's final LayerNorm
        x = g.layer_norm("encoder_norm.", x, "memory")

    # Each row's last real source position (0 for a row with none), for cross_last.
    count = g.node("ReduceSum", [g.node("Cast", [src_mask], ["src_mask_i64"],
                                        to=TensorProto.INT64), "axis1"], ["src_count"])
    last = g.node("Sub", [g.node("Max", [count, "one"], ["src_lengths"]), "one"], ["src_last"])
    # Every decoder layer's cross keys in one product, and values in another: columns
    # [layer][head][head_dim], so one Transpose makes each cache.
    rows = []
    for kind in ("keys", "values"):
        projected = g.node("Add", [g.node("MatMul", [x, g.stored(f"cross_{kind}.weight")],
                                          [f"cross_{kind}_nobias"]),
                                   g.stored(f"cross_{kind}.bias")], [f"cross_{kind}_flat"])
        split = g.node("Reshape", [projected, g.const(
            f"cross_{kind}_shape", np.array([0, 0, layers, heads, head_dim], np.int64))],
                       [f"cross_{kind}_5d"])
        g.node("Transpose", [split], [f"cross_{kind}"], perm=[2, 0, 3, 1, 4])
        row = g.node("GatherND", [projected, last], [f"cross_last_{kind}"], batch_dims=1)
        rows.append(g.node("Reshape", [row, g.const(
            f"cross_last_{kind}_shape", np.array([0, layers, d_model], np.int64))],
                           [f"cross_last_{kind}_3d"]))
    # cross_last: [batch, 1, layers * 2 * d_model], layer by layer, key before value
    pairs = g.node("Concat", rows, ["cross_last_pairs"], axis=2)
    g.node("Reshape", [pairs, g.const("cross_last_shape", np.array([0, 1, -1], np.int64))],
           ["cross_last"])

    cache = [layers, "batch", heads, "src_len", head_dim]
    F = TensorProto.FLOAT
    return g.model(
        "encoder",
        [_value_info("src_tokens", TensorProto.INT64, ["batch", "src_len"])],
        [_value_info("cross_keys", F, cache), _value_info("cross_values", F, cache),
         _value_info("src_mask", TensorProto.BOOL, ["batch", "src_len"]),
         _value_info("cross_last", F, ["batch", 1, 2 * layers * d_model])],
    )


# onnxruntime's GroupQueryAttention runs on the CPU only for head sizes that are a multiple of
# 8; other models' decoders get attention built of plain operators (``plain_self_attention``).
FUSED_HEAD_MULTIPLE = 8


def fused_attention_fits(config: ModelConfig) -> bool:
    """Whether the attentions can be onnxruntime's fused kernels: a head size they take, and
    no relative positions (which add terms inside the attention)."""
    return config.head_dim % FUSED_HEAD_MULTIPLE == 0 and not config.max_relative_positions


def _relative_tables(g: _GraphBuilder, prefix: str, index: str, name: str,
                     ) -> tuple[str, str]:
    """The attention's relative key and value vectors for each (query, key) pair of
    ``index`` (rows of its tables): ``index``'s shape + [head_dim] each."""
    return tuple(g.node("Gather", [g.stored(prefix + f"relative_{kind}"), index],
                        [f"{name}_relative_{kind}"])
                 for kind in ("keys", "values"))  # type: ignore[return-value]


def plain_attention_inputs(g: _GraphBuilder, config: ModelConfig) -> None:
    """What every layer's plain attention shares: the score scale, the most negative score,
    the head split's shape, and which cache columns each row attends to (self: up to its
    position; cross: its source length, at least 1, as GroupQueryAttention reads it)."""
    node = g.node
    g.const("attention_scale", np.array(config.head_dim ** -0.5, np.float32))
    g.const("masked_score", np.array(np.finfo(np.float32).min, np.float32))
    g.const("zero_value", np.array(0, np.float32))
    g.const("head_shape", np.array([0, 1, config.heads, config.head_dim], np.int64))
    g.const("merged_shape", np.array([0, 1, config.d_model], np.int64))
    g.const("zero_i64", np.array(0, np.int64))
    g.const("row_shape", np.array([0, 1, 1, -1], np.int64))
    g.const("column_shape", np.array([0, 1, -1, 1], np.int64))
    g.const("six_zeros", np.zeros(6, np.int64))
    g.const("zero_1d", np.zeros(1, np.int64))
    # Self caches: the step's columns are max(past columns, longest position + 1), past
    # columns padded with zeros when the longest row outgrows them (a bound buffer never is).
    past = node("Squeeze", [node("Shape", ["self_keys_0"], ["past_columns_1d"], start=2, end=3)],
                ["past_columns"])
    longest = node("Add", ["longest_position", "one"], ["longest_total"])
    columns = node("Max", [past, longest], ["step_columns"])
    grow = node("Reshape", [node("Sub", [columns, past], ["grown_columns"]), g.const(
        "one_dim", np.array([1], np.int64))], ["grown_columns_1d"])
    node("Concat", ["six_zeros", grow, "zero_1d"], ["self_pads"], axis=0)  # [b, h, +cols, d]
    index = node("Range", ["zero_i64", columns, "one"], ["self_columns"])
    row = node("Unsqueeze", [index, g.const("axis0", np.array([0], np.int64))],
               ["self_columns_2d"])
    at = node("Equal", [row, "positions_2d"], ["self_at_position"])
    node("Reshape", [at, "column_shape"], ["self_write"])  # [batch, 1, columns, 1]
    seen = node("LessOrEqual", [row, "positions_2d"], ["self_seen_2d"])
    node("Reshape", [seen, "row_shape"], ["self_seen"])  # [batch, 1, 1, columns]
    if config.max_relative_positions:  # each column's table row: its clipped distance
        node("Add", [relative_distance(g, node("Sub", [row, "positions_2d"],
                                               ["self_distance"]), config), "max_relative"],
             ["self_relative_index"])  # [batch, columns]
    # Cross caches: columns below each row's source length.
    width = node("Squeeze", [node("Shape", ["cross_keys_0"], ["src_width_1d"], start=2,
                                  end=3)], ["src_width"])
    source = node("Unsqueeze", [node("Range", ["zero_i64", width, "one"], ["src_columns"]),
                                "axis0"], ["src_columns_2d"])
    lengths = node("Unsqueeze", ["src_lengths", "axis1"], ["src_lengths_2d"])
    node("Reshape", [node("Less", [source, lengths], ["src_seen_2d"]), "row_shape"],
         ["src_seen"])


def relative_distance(g: _GraphBuilder, distance: str, config: ModelConfig) -> str:
    """``distance`` clipped at the model's relative reach, either way."""
    k = config.max_relative_positions
    g.const("max_relative", np.array(k, np.int64))
    g.const("min_relative", np.array(-k, np.int64))
    return g.node("Clip", [distance, "min_relative", "max_relative"], [f"{distance}_clipped"])


def _heads(g: _GraphBuilder, x: str, name: str) -> str:
    """[batch, 1, d_model] -> [batch, heads, 1, head_dim]"""
    return g.node("Transpose", [g.node("Reshape", [x, "head_shape"], [f"{name}_split"])],
                  [name], perm=[0, 2, 1, 3])


def _attend(g: _GraphBuilder, q: str, keys: str, values: str, seen: str, name: str,
            relative: tuple[str, str] | None = None) -> str:
    """softmax(q kᵀ / sqrt(head_dim)) v over the columns ``seen`` ([batch, 1, 1, columns]);
    [batch, 1, d_model]. ``relative``: per-row relative key and value vectors [batch, 1,
    columns, head_dim]. One query a row, so q (k + r_k)ᵀ and p (v + r_v) are the relative
    terms in the same MatMuls, which a row computes alike alone and in a batch (separate
    products broadcast over the heads did not). Values in unseen columns are zeroed first:
    the cache's spare columns hold whatever was there (even NaN), and 0 x NaN is NaN."""
    node = g.node
    if relative:
        keys = node("Add", [keys, relative[0]], [f"{name}_relative_keys_added"])
        values = node("Add", [values, relative[1]], [f"{name}_relative_values_added"])
    seen_rows = node("Transpose", [seen], [f"{name}_seen_rows"], perm=[0, 1, 3, 2])
    values = node("Where", [seen_rows, values, "zero_value"], [f"{name}_seen_values"])
    dots = node("MatMul", [q, node("Transpose", [keys], [f"{name}_keys_t"], perm=[0, 1, 3, 2])],
                [f"{name}_dots"])
    scores = node("Mul", [dots, "attention_scale"], [f"{name}_scores"])
    masked = node("Where", [seen, scores, "masked_score"], [f"{name}_masked"])
    probs = node("Softmax", [masked], [f"{name}_probs"], axis=-1)
    context = node("Transpose", [node("MatMul", [probs, values], [f"{name}_context_h"])],
                   [f"{name}_context_t"], perm=[0, 2, 1, 3])
    return node("Reshape", [context, "merged_shape"], [f"{name}_context"])


def plain_self_attention(g: _GraphBuilder, config: ModelConfig, qkv: str,
                         caches: dict[str, str], i: int, prefix: str) -> str:
    """GroupQueryAttention's self-attention step in plain operators: this step's key/value
    written at each row's position (into the bound buffer, as the fused kernel does), then
    attention over the columns up to it, with relative positions where the model has them."""
    node = g.node
    relative = None
    if config.max_relative_positions:
        pair = _relative_tables(g, prefix, "self_relative_index", f"self_{i}")
        relative = tuple(node("Unsqueeze", [table, "axis1"], [f"{table}_4d"])
                         for table in pair)
    q, k, v = (f"plain_{part}_{i}" for part in "qkv")
    node("Split", [qkv], [q, k, v], axis=2, num_outputs=3)
    for kind, new in (("keys", k), ("values", v)):
        padded = node("Pad", [caches[f"self_{kind}"], "self_pads"], [f"padded_{kind}_{i}"])
        node("Where", ["self_write", _heads(g, new, f"new_{kind}_{i}"), padded],
             [f"present_{kind}_{i}"])
    return _attend(g, _heads(g, q, f"plain_q_heads_{i}"), f"present_keys_{i}",
                   f"present_values_{i}", "self_seen", f"self_{i}", relative)


def plain_cross_attention(g: _GraphBuilder, config: ModelConfig, q: str,
                          caches: dict[str, str], i: int) -> str:
    """GroupQueryAttention's cross-attention in plain operators: over each row's source
    columns; the caches pass through unchanged."""
    for kind in ("keys", "values"):
        g.node("Identity", [caches[f"cross_{kind}"]], [f"present_cross_{kind}_{i}"])
    return _attend(g, _heads(g, q, f"cross_q_heads_{i}"), caches["cross_keys"],
                   caches["cross_values"], "src_seen", f"cross_{i}")



def _fused_decoder_graph(model: Transformer):
    """The decoder step as a hand-built graph of onnxruntime's fused CPU kernels: the same
    maths as ``Transformer.decode_step`` in well under half the nodes of a traced graph.

    Both attentions are ``com.microsoft.GroupQueryAttention``, which reads each row's own
    number of cache columns and no more:

    * self-attention: one MatMul for Q/K/V, whose packed output the kernel reads as it is;
      ``positions`` are the rows' cache lengths (the contract's left-aligned layout) and the
      kernel writes this step's key/value after them;
    * cross-attention: the cache is the encoder's keys/values, each row's length its count of
      real source tokens. The kernel wants a new key/value to append: the row's last source
      position's own (``cross_last``, one Split for every layer), so it attends over exactly
      its source (writing that column back unchanged) instead of over the batch's padded
      width. Serving 64 clients, padding made the mean width 125 and cross-attention 39% of
      a step.

    Each writes its cache output in place when the caller binds it to the input's buffer
    (onnxruntime's shared past/present buffers; ``service.batch`` does), else returns a
    copy. Post-norm Add & Norm is two Adds and a ``LayerNormalization``; pre-norm is
    ``LayerNormalization`` before the sublayer and an Add after."""
    from onnx import TensorProto

    g = _GraphBuilder(model, "decoder")
    config = g.config
    heads, d_model = config.heads, config.d_model
    node = g.node
    g.embedding_tables(model)
    g.const("axis1", np.array([1], np.int64))
    g.const("one", np.array(1, np.int64))
    tokens = node("Unsqueeze", ["tokens", "axis1"], ["tokens_2d"])
    positions = node("Unsqueeze", ["positions", "axis1"], ["positions_2d"])
    x = node(
        "Add",
        [
            node("Gather", ["embed_table", tokens], ["embedded"]),
            node("Gather", ["position_table", positions], ["position_encoded"]),
        ],
        ["x_0"],
    )
    # GroupQueryAttention's per-row cache lengths (a row's position is its cache length)
    # and the longest row's total length, this step included.
    cache_lengths = node("Cast", ["positions"], ["cache_lengths"], to=TensorProto.INT32)
    longest = node("ReduceMax", ["positions"], ["longest_position"], keepdims=0)
    total = node("Cast", [node("Add", [longest, "one"], ["total_length_i64"])],
                 ["total_length"], to=TensorProto.INT32)
    # Cross-attention: each row's source length (at least 1: an idle row's mask may be
    # empty), the index of its last source position, and the longest.
    mask_i64 = node("Cast", ["src_mask"], ["src_mask_i64"], to=TensorProto.INT64)
    src_lengths = node("Max", [node("ReduceSum", [mask_i64, "axis1"], ["src_count"],
                                    keepdims=0), "one"], ["src_lengths"])
    src_last = node("Cast", [node("Sub", [src_lengths, "one"], ["src_last"])],
                    ["src_last_i32"], to=TensorProto.INT32)
    src_total = node("Cast", [node("ReduceMax", [src_lengths], ["src_longest"], keepdims=0)],
                     ["src_total"], to=TensorProto.INT32)
    last_source = [f"cross_last_{kind}_{i}" for i in range(config.decoder_layers)
                   for kind in ("key", "value")]
    node("Split", ["cross_last"], last_source, axis=2, num_outputs=len(last_source))

    plain = not fused_attention_fits(config)
    if plain:
        plain_attention_inputs(g, config)

    for i in range(config.decoder_layers):
        p = f"decoder_layers.{i}."
        caches = {name: f"{name}_{i}" for name in CACHE_INPUTS}
        a, c = p + "self_attn.", p + "cross_attn."

        def self_attention(y: str, i=i, a=a, caches=caches) -> tuple[str, str]:
            if plain:
                context = plain_self_attention(g, config, g.qkv(a, y, i), caches, i, a)
                return node("MatMul", [context, g.weight(a + "w_o.")], [f"self_out_{i}"]), (
                    a + "w_o.bias")
            context = node(
                "GroupQueryAttention",
                [g.qkv(a, y, i), "", "", caches["self_keys"], caches["self_values"],
                 cache_lengths, total],
                [f"self_context_{i}", f"present_keys_{i}", f"present_values_{i}"],
                domain="com.microsoft", num_heads=heads, kv_num_heads=heads,
            )
            out = node("MatMul", [context, g.weight(a + "w_o.")], [f"self_out_{i}"])
            return out, a + "w_o.bias"

        def cross_attention(y: str, i=i, c=c, caches=caches) -> tuple[str, str]:
            q = node("Add", [node("MatMul", [y, g.weight(c + "w_q.")], [f"cross_q_nobias_{i}"]),
                             g.bias(c + "w_q.bias")], [f"cross_q_{i}"])
            keys, values = caches["cross_keys"], caches["cross_values"]
            if plain:
                context = plain_cross_attention(g, config, q, caches, i)
                return node("MatMul", [context, g.weight(c + "w_o.")], [f"cross_out_{i}"]), (
                    c + "w_o.bias")
            context = node(
                "GroupQueryAttention",
                [q, f"cross_last_key_{i}", f"cross_last_value_{i}", keys, values, src_last,
                 src_total],
                [f"cross_context_{i}", f"present_cross_keys_{i}", f"present_cross_values_{i}"],
                domain="com.microsoft", num_heads=heads, kv_num_heads=heads,
            )
            out = node("MatMul", [context, g.weight(c + "w_o.")], [f"cross_out_{i}"])
            return out, c + "w_o.bias"

        x = g.sublayer(p, 0, x, f"self_{i}", self_attention)
        x = g.sublayer(p, 1, x, f"cross_{i}", cross_attention)
        x = g.sublayer(p, 2, x, f"ffn_{i}",
                       lambda y, i=i, f=p + "feed_forward.": g.feed_forward(f, y, i))

    if config.pre_norm:  # the pre-norm stack's final LayerNorm
        x = g.layer_norm("decoder_norm.", x, "decoder_out")
    never = model.never_generate.numpy()
    logits = node("MatMul", [x, g.stored("generator.weight")], ["logits_3d"])
    # The logits bias, if any, rides on the mask's Add (the mask's -3.4e38 absorbs it).
    penalty = np.where(never, np.finfo(np.float32).min, 0).astype(np.float32)
    if config.output_bias:
        penalty = penalty + pack(g.layout["never_generate"], g.state, config)
    logits = node("Add", [logits, g.const("never_generate", penalty)], ["logits_masked"])
    node("Squeeze", [logits, "axis1"], ["logits"])
    node("LogSoftmax", ["logits"], ["log_probs"], axis=-1)
    L, H, D = config.decoder_layers, heads, config.head_dim

    F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    lengths = {"self": "past", "cross": "src_len", "present": "present_len",
               "present_cross": "src_len"}
    inputs = {
        "tokens": _value_info("tokens", I64, ["batch"]),
        "positions": _value_info("positions", I64, ["batch"]),
        "src_mask": _value_info("src_mask", B, ["batch", "src_len"]),
        "cross_last": _value_info("cross_last", F, ["batch", 1, 2 * L * d_model]),
    }
    outputs = {"log_probs": _value_info("log_probs", F, ["batch", config.vocab_size])}
    for name in decoder_inputs(L)[len(inputs):] + decoder_outputs(L)[1:]:
        kind = "present_cross" if name.startswith("present_cross") else name.split("_")[0]
        cache = _value_info(name, F, ["batch", H, lengths[kind], D])
        (outputs if name.startswith("present") else inputs)[name] = cache
    return g.model("decoder_step", list(inputs.values()), list(outputs.values()))


def ordinary_ids(config: ModelConfig, vocab_size: int) -> np.ndarray:
    """The ids below ``vocab_size`` that are no special token: what random test sentences
    are drawn from."""
    special = [config.pad_id, config.unk_id, config.bos_id, config.eos_id]
    return np.setdiff1d(np.arange(vocab_size), special)


def random_sources(config: ModelConfig, lengths: list[int], rng: np.random.Generator,
                   ) -> np.ndarray:
    """A padded batch of random source sentences of ``lengths`` tokens, each ending in EOS."""
    ids = ordinary_ids(config, config.src_vocab_size)
    src = np.full((len(lengths), max(lengths)), config.pad_id, dtype=np.int64)
    for row, length in enumerate(lengths):
        src[row, :length] = rng.choice(ids, length)
        src[row, length - 1] = config.eos_id
    return src


def verify_batch_invariance(out_dir: Path, encoder: str, decoder: str, config: ModelConfig,
                            seed: int = 0) -> None:
    """Raise unless every row's encoder outputs and decoder log-probs are bit-identical whether
    computed alone or inside a batch (a quantisation scheme or kernel can break this). Rows
    alone run on one thread, batches on all: the engine decodes a lone row that way."""
    rng = np.random.default_rng(seed)
    encoder_session, decoder_session = _session(out_dir / encoder), _session(out_dir / decoder)
    encoder_alone = _session(out_dir / encoder, threads=1)
    decoder_alone = _session(out_dir / decoder, threads=1)
    src = random_sources(config, [7, 3, 11, 1, 5, 9], rng)
    cross_keys, cross_values, src_mask, last = encoder_session.run(None, {"src_tokens": src})
    layers, batch, heads, _, head_dim = cross_keys.shape
    # Rows at different positions, as in a running batch that sentences joined at different
    # steps: each row alone gets its own history only, in a cache as wide as that history.
    positions = np.array([4, 0, 2, 4, 1, 3], dtype=np.int64)[:batch]
    past = int(positions.max()) + 2  # wider than any row's history: junk columns never count
    stacked = {
        "tokens": rng.choice(ordinary_ids(config, config.vocab_size), batch).astype(np.int64),
        "positions": positions,
        "self_keys": rng.standard_normal((layers, batch, heads, past, head_dim), np.float32),
        "self_values": rng.standard_normal((layers, batch, heads, past, head_dim), np.float32),
        "cross_keys": cross_keys,
        "cross_values": cross_values,
        "src_mask": src_mask,
        "cross_last": last,
    }
    batched = decoder_session.run(None, decoder_feeds(**stacked))[0]
    for row in range(batch):
        alone_keys, _, _, alone_last = encoder_alone.run(None, {"src_tokens": src[row : row + 1]})
        if not (np.array_equal(alone_keys, cross_keys[:, row : row + 1])
                and np.array_equal(alone_last, last[row : row + 1])):
            raise RuntimeError(f"batch invariance: {encoder} row {row} differs alone")
        own = slice(0, int(positions[row]))
        alone = {key: value[:, row : row + 1] if value.ndim == 5 else value[row : row + 1]
                 for key, value in stacked.items()}
        alone["self_keys"] = alone["self_keys"][:, :, :, own]
        alone["self_values"] = alone["self_values"][:, :, :, own]
        if not np.array_equal(decoder_alone.run(None, decoder_feeds(**alone))[0],
                              batched[row : row + 1]):
            raise RuntimeError(f"batch invariance: {decoder} row {row} differs alone")


def _session(path: Path, threads: int = 0) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


def verify_parity(model: Transformer, out_dir: Path, steps: int = 6, seed: int = 0) -> float:
    """Largest |ONNX - PyTorch| over encoder outputs and ``steps`` decoder steps of a padded,
    mixed-length batch, feeding each side its own cache. Raises if above ``PARITY_ATOL``."""
    src = torch.from_numpy(random_sources(model.config, [9, 4, 1, 7],
                                          np.random.default_rng(seed)))
    encoder, decoder = _session(out_dir / "encoder.onnx"), _session(out_dir / "decoder.onnx")
    worst = 0.0
    with torch.no_grad():
        ck, cv, sm = model.encode_cross(src)
        onnx_ck, onnx_cv, onnx_sm, onnx_last = encoder.run(None, {"src_tokens": src.numpy()})
        worst = max(
            worst,
            float(np.abs(onnx_ck - ck.numpy()).max()),
            float(np.abs(onnx_cv - cv.numpy()).max()),
            float(np.abs(onnx_last - cross_last(ck, cv, sm).numpy()).max()),
        )
        if not np.array_equal(onnx_sm, sm.numpy()):
            raise RuntimeError("parity: encoder src_mask differs from PyTorch")
        layers, batch, heads, _, head_dim = ck.shape
        keys = values = torch.zeros(layers, batch, heads, 0, head_dim)
        onnx_keys = onnx_values = keys.numpy()
        tokens = torch.full((batch,), model.config.bos_id, dtype=torch.long)
        for step in range(steps):
            positions = torch.full((batch,), step, dtype=torch.long)
            self_mask = torch.ones(batch, step + 1, dtype=torch.bool)
            log_probs, k, v = model.decode_step(
                tokens, positions, keys, values, self_mask, ck, cv, sm
            )
            onnx_log_probs, *presents = decoder.run(
                None,
                decoder_feeds(tokens.numpy(), positions.numpy(), onnx_keys, onnx_values,
                              onnx_ck, onnx_cv, onnx_sm, onnx_last),
            )
            presents, cross = presents[: 2 * layers], presents[2 * layers :]
            # The cross caches come back unchanged: bound in place, as the engine binds them,
            # anything else would corrupt them for the next step.
            for layer, (keys_out, values_out) in enumerate(zip(cross[0::2], cross[1::2],
                                                               strict=True)):
                real = onnx_sm.astype(bool)
                if not (np.array_equal(keys_out.transpose(0, 2, 1, 3)[real],
                                       onnx_ck[layer].transpose(0, 2, 1, 3)[real])
                        and np.array_equal(values_out.transpose(0, 2, 1, 3)[real],
                                           onnx_cv[layer].transpose(0, 2, 1, 3)[real])):
                    raise RuntimeError(f"parity: layer {layer}'s cross cache changed at step "
                                       f"{step}")
            onnx_k, onnx_v = np.stack(presents[0::2]), np.stack(presents[1::2])
            worst = max(worst, float(np.abs(onnx_log_probs - log_probs.numpy()).max()))
            if not np.array_equal(onnx_log_probs.argmax(-1), log_probs.argmax(-1).numpy()):
                raise RuntimeError(f"parity: greedy choice differs from PyTorch at step {step}")
            worst = max(
                worst,
                float(np.abs(onnx_k - k.numpy()).max()),
                float(np.abs(onnx_v - v.numpy()).max()),
            )
            keys, values, onnx_keys, onnx_values = k, v, onnx_k, onnx_v
            tokens = log_probs.argmax(-1)
    if worst > PARITY_ATOL:
        raise RuntimeError(f"parity: ONNX differs from PyTorch by {worst:.2e} > {PARITY_ATOL:.0e}")
    return worst


def _training_summary(checkpoint: dict[str, Any]) -> dict[str, Any]:
    config = checkpoint.get("config", {})
    data = config.get("data", {})
    return {
        "step": checkpoint.get("step"),
        "sources": data.get("sources", []),
        "filters": data.get("filters", {}),
        "vocab": config.get("vocab", {}),
        "train": config.get("train", {}),
        "dev_metrics": checkpoint.get("metrics", {}),
    }


MODEL_CARD = "MODEL_CARD.md"


def _write_tokenizers(staging: Path, source_model: Path, imported: dict[str, Any],
                      ) -> dict[str, Any]:
    """Copy the SentencePiece model(s) and, for an imported model, its vocabularies into the
    bundle; returns the manifest's entries for them (``service/vocabulary.py``)."""
    shutil.copyfile(source_model, staging / "sentencepiece.model")
    entries: dict[str, Any] = {"tokenizer": "sentencepiece.model"}
    if imported.get("target_tokenizer"):
        shutil.copyfile(imported["target_tokenizer"], staging / "target.sentencepiece.model")
        entries["target_tokenizer"] = "target.sentencepiece.model"
    pieces = imported.get("vocabulary")
    if pieces:
        shared = pieces["source"] == pieces["target"]
        names = ({"source": "vocabulary.json", "target": "vocabulary.json"} if shared else
                 {"source": "source_vocabulary.json", "target": "target_vocabulary.json"})
        for side, name in names.items():
            (staging / name).write_text(json.dumps(pieces[side], ensure_ascii=False),
                                        encoding="utf-8")
        entries["vocabulary"] = names
    if imported.get("target_languages"):
        entries["target_languages"] = dict(imported["target_languages"])
    entries["source_format"] = dict(imported.get("source_format")
                                    or {"add_bos": False, "add_eos": True})
    return entries


def export_bundle(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    int8: bool = False,
    fp16: bool = False,
    calibration: str | Path | None = None,
    check_parity: bool = True,
    default_variant: str = "fp32",
    scores: dict[str, Any] | None = None,
    decoding: dict[str, Any] | None = None,
) -> Path:
    """Export ``checkpoint`` to a bundle in ``out_dir`` (replaced atomically when it passes).
    ``decoding`` is the model's recommended decoding (``service.bundle.DECODING_KEYS``).
    ``int8`` adds static int8 graphs (``training.quantize``), calibrated on the first
    sentences of ``calibration`` (default: the checkpoint's training data, train.tsv; for an
    imported model without one, sequences drawn from its own vocabulary). ``fp16`` adds the
    fp16 graphs for onnxruntime's CUDA provider (``training.fp16``), checked against fp32."""
    decoding = dict(decoding or {})
    unknown = set(decoding) - set(DECODING_KEYS)
    if unknown:
        raise ValueError(f"decoding: unknown key(s) {sorted(unknown)}; allowed: {DECODING_KEYS}")
    DecodeOptions(**decoding)  # raises on a value the engine would refuse
    model, ckpt = load_checkpoint(checkpoint)
    config = model.config
    vocab = Path(ckpt["vocab"])
    if not vocab.is_file():
        raise FileNotFoundError(f"the checkpoint's SentencePiece model {vocab} does not exist")
    data_config = ckpt.get("config", {}).get("data", {})
    imported = ckpt.get("import", {})
    if int8 and not (imported and calibration is None):  # checked before any work
        calibration = Path(calibration or Path(data_config.get("out_dir", ".")) / "train.tsv")
        if not calibration.is_file():
            raise FileNotFoundError(
                f"int8 graphs are calibrated on sample sentences and {calibration} does not "
                "exist: name a file of them with --calibration (TSV, source first, or one "
                "sentence a line)"
            )
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the bundle is read by other users
    try:
        export_graphs(model, staging)
        worst = verify_parity(model, staging) if check_parity else None
        if worst is not None:
            log.info("parity: max |ONNX - PyTorch| = %.2e", worst)
        variants = {"fp32": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}}
        special_ids = {"pad": config.pad_id, "unk": config.unk_id, "bos": config.bos_id,
                       "eos": config.eos_id}
        if imported.get("source_bos_id") is not None:  # the start of a source, not of decoding
            special_ids["source_bos"] = imported["source_bos_id"]
        tokenizers = _write_tokenizers(staging, vocab, imported)
        if int8:
            vocabulary = Vocabulary.from_manifest(
                staging, {**tokenizers, "special_ids": special_ids})
            target = next(iter(vocabulary.target_languages), None)
            max_tokens = config.max_positions
            if calibration is None:
                sources = vocabulary_sources(ordinary_ids(config, config.src_vocab_size),
                                             config.eos_id)
                origin = "random sequences of the model's own vocabulary"
            else:
                sources = calibration_sources(
                    calibration, lambda text: vocabulary.encode(clean_text(text), target),
                    max_tokens)
                origin = f"sentences of {calibration.name}"
            quantize_int8(staging, sources, config)
            variants["int8"] = {
                "encoder": "encoder.int8.onnx",
                "decoder": "decoder.int8.onnx",
                "quantization": f"static: uint8 activations calibrated on {len(sources)} "
                f"{origin}, 7-bit weights per column",
            }
        for graphs in variants.values():
            verify_batch_invariance(staging, graphs["encoder"], graphs["decoder"], config)
        if fp16:  # for a GPU, whose kernels are no batch-invariant anyway: checked against fp32
            variants["fp16"] = checked_fp16(staging, config.src_vocab_size, special_ids)
        if default_variant not in variants:
            raise ValueError(f"default variant {default_variant!r} was not exported")
        files = sorted(p.name for p in staging.iterdir() if p.is_file())
        manifest = {
            "contract_version": CONTRACT_VERSION,
            "source_lang": imported.get("source_lang") or data_config.get("source_lang", "en"),
            "target_lang": imported.get("target_lang") or data_config.get("target_lang", "de"),
            "special_ids": special_ids,
            "model": {**dataclasses.asdict(config), "head_dim": config.head_dim},
            "max_positions": config.max_positions,
            **tokenizers,
            "variants": variants,
            "default_variant": default_variant,
            "files": {name: sha256_file(staging / name) for name in files},
            "parity_max_abs_diff": worst,
            **({"imported_from": imported["origin"]} if imported else
               {"training": _training_summary(ckpt)}),
            "scores": scores or {},
            "decoding": decoding,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if (out_dir / MODEL_CARD).is_file():  # written by people, not by export: keep it
            shutil.copy2(out_dir / MODEL_CARD, staging / MODEL_CARD)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
