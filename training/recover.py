"""Rebuild a PyTorch checkpoint from a bundle's fp32 graphs, so a shipped model can be trained
further (``train --init-from``) or compared against other engines when its training run is gone.

Every parameter of the model is an initializer of ``encoder.onnx`` or ``decoder.onnx``, both
built by hand from the module's named weights, transposed for MatMul or concatenated (see
``export._GraphBuilder``), which is undone here: the tied embedding is the decoder's output
projection, an untied model's embeddings are its gather tables (unscaled), and a logits bias
is read off the never-generate mask it was folded into. Post-norm and pre-norm stacks,
separate vocabularies and relative position tables all come back. The result is checked by
loading it into a ``Transformer`` with ``strict=True``; ``export`` then checks the maths.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import torch

from service.bundle import load_bundle
from training.config import ModelConfig
from training.model import Transformer

# A bundle's "model" section also carries derived fields (head_dim) for the service.
_CONFIG_FIELDS = {field.name for field in dataclasses.fields(ModelConfig)}


def _initializers(path: Path) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return {init.name: numpy_helper.to_array(init) for init in graph.initializer}


def _columns(matrix: np.ndarray, parts: int) -> list[np.ndarray]:
    """A MatMul weight [in, parts * out] back into ``parts`` nn.Linear weights [out, in]."""
    return [part.T for part in np.split(matrix, parts, axis=1)]


def _layer_params(inits: dict[str, np.ndarray], p: str, norms: int) -> dict[str, np.ndarray]:
    """One encoder or decoder layer's self-attention (and its relative position tables, where
    the model has them), feed-forward and norms: what both graphs store alike (the decoder's
    cross-attention is read by the caller)."""
    params: dict[str, np.ndarray] = {}
    qkv_b = np.split(inits[p + "self_attn.qkv.bias"], 3)
    for part, weight, bias in zip("qkv", _columns(inits[p + "self_attn.qkv.weight"], 3), qkv_b,
                                  strict=True):
        params[p + f"self_attn.w_{part}.weight"] = weight
        params[p + f"self_attn.w_{part}.bias"] = bias
    for linear in ("self_attn.w_o.", "feed_forward.w_1.", "feed_forward.w_2."):
        params[p + linear + "weight"] = inits[p + linear + "weight"].T
        params[p + linear + "bias"] = inits[p + linear + "bias"]
    for table in ("self_attn.relative_keys", "self_attn.relative_values"):
        if p + table in inits:
            params[p + table] = inits[p + table]
    for norm in range(norms):
        for part in ("weight", "bias"):
            name = f"{p}sublayer.{norm}.norm.{part}"
            params[name] = inits[name]
    return params


def _final_norm(inits: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """A pre-norm stack's final LayerNorm (none in a post-norm graph)."""
    return {f"{name}.{part}": inits[f"{name}.{part}"] for part in ("weight", "bias")
            if f"{name}.{part}" in inits}


def _unscaled(table: np.ndarray, config: ModelConfig) -> np.ndarray:
    """An embedding table as the graphs gather it (times sqrt(d_model) when the model scales
    embeddings, §3.4) back to the parameter."""
    return table / math.sqrt(config.d_model) if config.scale_embeddings else table


def _encoder_params(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    inits = _initializers(path)
    if "cross_keys.weight" not in inits:
        raise ValueError(f"{path}: not a graph of this exporter (exported before the encoder "
                         "was built by hand); recover it with the version that exported it")
    params: dict[str, np.ndarray] = _final_norm(inits, "encoder_norm")
    if not config.shared_embeddings:
        params["source_embeddings.lut.weight"] = _unscaled(inits["source_embed_table"], config)
    for i in range(config.encoder_layers):
        params.update(_layer_params(inits, f"encoder_layers.{i}.", norms=2))
    # The decoder layers' cross keys and values, projected from the encoder's output here.
    for kind in ("keys", "values"):
        weights = _columns(inits[f"cross_{kind}.weight"], config.decoder_layers)
        biases = np.split(inits[f"cross_{kind}.bias"], config.decoder_layers)
        for i, (weight, bias) in enumerate(zip(weights, biases, strict=True)):
            linear = f"decoder_layers.{i}.cross_attn.w_{kind[0]}."
            params[linear + "weight"], params[linear + "bias"] = weight, bias
    return params


def _decoder_params(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    inits = _initializers(path)
    output = inits["generator.weight"].T  # the pre-softmax projection [vocab, d_model]
    params = _final_norm(inits, "decoder_norm")
    if config.tie_output:
        params["embeddings.lut.weight"] = output
    else:
        params["embeddings.lut.weight"] = _unscaled(inits["embed_table"], config)
        params["output_projection.weight"] = output
    if config.output_bias:
        # The logits bias rides on the never-generate mask's Add: the mask's lowest float
        # absorbed it for the tokens never generated (padding, start), whose bias is lost
        # and is never used.
        penalty = inits["never_generate"]
        params["output_bias"] = np.where(penalty > np.finfo(np.float32).min / 2, penalty, 0)
    for i in range(config.decoder_layers):
        p = f"decoder_layers.{i}."
        params.update(_layer_params(inits, p, norms=3))
        for linear in ("cross_attn.w_q.", "cross_attn.w_o."):
            params[p + linear + "weight"] = inits[p + linear + "weight"].T
            params[p + linear + "bias"] = inits[p + linear + "bias"]
    return params


def checkpoint_from_bundle(bundle_dir: str | Path, out_path: str | Path) -> Path:
    """Write ``out_path``: the bundle's fp32 weights as a checkpoint ``export`` and
    ``train --init-from`` read (model weights, config and step; no optimiser state)."""
    bundle = load_bundle(bundle_dir)  # manifest and checksums validated
    manifest, out_path = bundle.manifest, Path(out_path)
    config = ModelConfig(**{k: v for k, v in manifest["model"].items() if k in _CONFIG_FIELDS})
    encoder, decoder = bundle.graph_paths("fp32")
    params = _encoder_params(encoder, config)
    params.update(_decoder_params(decoder, config))
    model = Transformer(config)
    model.load_state_dict({k: torch.tensor(np.ascontiguousarray(v))
                           for k, v in params.items()}, strict=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # The vocabulary travels with the weights (their rows are its ids), beside the checkpoint.
    vocab = out_path.with_suffix(".spm.model")
    shutil.copyfile(bundle.tokenizer_path, vocab)
    training = manifest.get("training", {})
    data = {"source_lang": bundle.source_lang, "target_lang": bundle.target_lang,
            "sources": training.get("sources", []), "filters": training.get("filters", {})}
    torch.save({
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(config),
        # What export's manifest and train --init-from read from a training checkpoint.
        "config": {"data": data, "vocab": training.get("vocab", {}),
                   "train": training.get("train", {})},
        "step": int(training.get("step") or 0),
        "vocab": str(vocab.resolve()),
        "metrics": training.get("dev_metrics", {}),
        "recovered_from": str(bundle.dir.resolve()),
    }, out_path)
    return out_path
