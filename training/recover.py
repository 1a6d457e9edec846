"""Rebuild a PyTorch checkpoint from a bundle's fp32 graphs, so a shipped model can be trained
further (``train --init-from``) or compared against other engines when its training run is gone.

Every parameter of the model is an initializer of ``encoder.onnx`` or ``decoder.onnx``, where
``training.weights.graph_layout`` says (transposed for MatMul, concatenated, a scaled gather
table, a logits bias folded into the never-generate mask), which is undone here for every
model export writes: post-norm and pre-norm, shared or separate vocabularies, tied or untied
outputs, relative position tables. The result is checked by loading it into a
``Transformer`` with ``strict=True``; ``export`` then checks the maths.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import torch

from service.bundle import load_bundle
from training.config import ModelConfig
from training.model import Transformer
from training.weights import LOGITS_BIAS, graph_layout, unpack

# A bundle's "model" section also carries derived fields (head_dim) for the service.
_CONFIG_FIELDS = {field.name for field in dataclasses.fields(ModelConfig)}


def _initializers(path: Path) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return {init.name: numpy_helper.to_array(init) for init in graph.initializer}


def model_params(encoder: Path, decoder: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    """Every parameter, read back from the graphs' initialisers as
    ``training.weights.graph_layout`` declares them: arrays that only approximate their
    parameter first, exact ones over them."""
    graphs = {"encoder": _initializers(encoder), "decoder": _initializers(decoder)}
    if "cross_keys.weight" not in graphs["encoder"]:
        raise ValueError(f"{encoder}: not a graph of this exporter (exported before the "
                         "encoder was built by hand); recover it with the version that "
                         "exported it")
    params: dict[str, np.ndarray] = {}
    for stored in sorted(graph_layout(config), key=lambda s: s.exact):
        array = graphs[stored.graph][stored.name]
        if stored.kind == LOGITS_BIAS:
            # The never-generate mask's lowest float absorbed the bias of the tokens never
            # generated (padding, start): lost, and never used.
            array = np.where(array > np.finfo(np.float32).min / 2, array, 0)
        params.update(unpack(stored, array, config))
    return params


def checkpoint_from_bundle(bundle_dir: str | Path, out_path: str | Path) -> Path:
    """Write ``out_path``: the bundle's fp32 weights as a checkpoint ``export`` and
    ``train --init-from`` read (model weights, config and step; no optimiser state)."""
    bundle = load_bundle(bundle_dir)  # manifest and checksums validated
    manifest, out_path = bundle.manifest, Path(out_path)
    config = ModelConfig(**{k: v for k, v in manifest["model"].items() if k in _CONFIG_FIELDS})
    params = model_params(*bundle.graph_paths("fp32"), config)
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
