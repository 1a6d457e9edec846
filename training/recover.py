"""Rebuild a PyTorch checkpoint from a bundle's fp32 graphs, so a shipped model can be trained
further (``train --init-from``) or compared against other engines when its training run is gone.

Every parameter of the model is an initializer of ``encoder.onnx`` or ``decoder.onnx``: the
encoder's by the module's own names (the traced graph keeps them) except the Linear weights,
which the exporter folds into anonymous transposed MatMul constants; each of those feeds an Add
with its named bias, which names it. The decoder graph is built by hand from named, transposed
or concatenated weights (see ``export._fused_decoder_graph``), undone here. The result is checked
by loading it into a ``Transformer`` with ``strict=True``; ``export`` then checks the maths.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from service.bundle import load_bundle
from training.config import ModelConfig
from training.model import Transformer

# A bundle's "model" section also carries derived fields (head_dim) for the service.
_CONFIG_FIELDS = {field.name for field in dataclasses.fields(ModelConfig)}


def _initializers(path: Path) -> tuple[dict[str, np.ndarray], Any]:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return {init.name: numpy_helper.to_array(init) for init in graph.initializer}, graph


def _encoder_params(path: Path) -> dict[str, np.ndarray]:
    inits, graph = _initializers(path)
    params = {name.removeprefix("model."): value for name, value in inits.items()
              if name.startswith("model.")}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1] in params:
            continue
        biases = [name for add in consumers.get(node.output[0], []) if add.op_type == "Add"
                  for name in add.input if name.startswith("model.") and name.endswith(".bias")]
        if len(biases) != 1:
            raise ValueError(f"{path}: cannot name the weight {node.input[1]} (no single bias)")
        name = biases[0].removeprefix("model.").removesuffix(".bias") + ".weight"
        params[name] = inits[node.input[1]].T
    return params


def _decoder_params(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    inits, _ = _initializers(path)
    d_model = config.d_model
    params: dict[str, np.ndarray] = {}
    for i in range(config.decoder_layers):
        p = f"decoder_layers.{i}."
        qkv_w, qkv_b = inits[p + "self_attn.qkv.weight"].T, inits[p + "self_attn.qkv.bias"]
        for j, part in enumerate("qkv"):
            rows = slice(j * d_model, (j + 1) * d_model)
            params[p + f"self_attn.w_{part}.weight"] = qkv_w[rows]
            params[p + f"self_attn.w_{part}.bias"] = qkv_b[rows]
        for linear in ("self_attn.w_o.", "cross_attn.w_q.", "cross_attn.w_o.",
                       "feed_forward.w_1.", "feed_forward.w_2."):
            params[p + linear + "weight"] = inits[p + linear + "weight"].T
        for name in ("self_attn.w_o.bias", "cross_attn.w_q.bias", "cross_attn.w_o.bias",
                     "feed_forward.w_1.bias", "feed_forward.w_2.bias"):
            params[p + name] = inits[p + name]
        for norm in range(3):
            for part in ("weight", "bias"):
                name = f"{p}sublayer.{norm}.norm.{part}"
                params[name] = inits[name]
    return params


def checkpoint_from_bundle(bundle_dir: str | Path, out_path: str | Path) -> Path:
    """Write ``out_path``: the bundle's fp32 weights as a checkpoint ``export`` and
    ``train --init-from`` read (model weights, config and step; no optimiser state)."""
    bundle = load_bundle(bundle_dir)  # manifest and checksums validated
    manifest, out_path = bundle.manifest, Path(out_path)
    if manifest["model"].get("pre_norm"):
        raise ValueError("only post-norm bundles can be recovered (the fused decoder graph)")
    config = ModelConfig(**{k: v for k, v in manifest["model"].items() if k in _CONFIG_FIELDS})
    encoder, decoder = bundle.graph_paths("fp32")
    params = _encoder_params(encoder)
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
