"""Turn a checkpoint into a self-contained bundle that ``service/`` runs without torch.

The bundle holds the two graphs of the ONNX contract (v1, see ``service/bundle.py``), the
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
from torch import Tensor, nn

from service.bundle import CONTRACT_VERSION, MANIFEST, sha256_file
from training.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from training.model import Transformer

log = logging.getLogger(__name__)

OPSET = 18
PARITY_ATOL = 1e-4


class EncoderGraph(nn.Module):
    """src_tokens -> cross_keys, cross_values, src_mask (the cached encoder outputs)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src_tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.model.encode_cross(src_tokens)


class DecoderGraph(nn.Module):
    """One decoding step with the self-attention key/value cache."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(
        self,
        tokens,
        positions,
        self_keys,
        self_values,
        self_mask,
        cross_keys,
        cross_values,
        src_mask,
    ):
        return self.model.decode_step(
            tokens, positions, self_keys, self_values, self_mask, cross_keys, cross_values, src_mask
        )


ENCODER_INPUTS = ["src_tokens"]
ENCODER_OUTPUTS = ["cross_keys", "cross_values", "src_mask"]
DECODER_INPUTS = [
    "tokens",
    "positions",
    "self_keys",
    "self_values",
    "self_mask",
    "cross_keys",
    "cross_values",
    "src_mask",
]
DECODER_OUTPUTS = ["log_probs", "present_keys", "present_values"]


def load_checkpoint(path: str | Path) -> tuple[Transformer, dict[str, Any]]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    config = ModelConfig(**checkpoint["model_config"])
    model = Transformer(config)
    model.load_state_dict(checkpoint["model"])
    return model.eval(), checkpoint


def _example_inputs(config: ModelConfig, batch: int = 2, src_len: int = 5, past: int = 3):
    layers, heads, head_dim = config.decoder_layers, config.heads, config.head_dim
    src = torch.randint(4, config.vocab_size, (batch, src_len))
    cache = torch.zeros(layers, batch, heads, past, head_dim)
    cross = torch.zeros(layers, batch, heads, src_len, head_dim)
    decoder_args = (
        torch.full((batch,), BOS_ID),
        torch.full((batch,), past),
        cache,
        cache.clone(),
        torch.ones(batch, past + 1, dtype=torch.bool),
        cross,
        cross.clone(),
        torch.ones(batch, src_len, dtype=torch.bool),
    )
    return (src,), decoder_args


def export_graphs(model: Transformer, out_dir: Path) -> None:
    """Write encoder.onnx and decoder.onnx with dynamic batch, source and cache lengths."""
    encoder_args, decoder_args = _example_inputs(model.config)
    axes = {
        "src_tokens": {0: "batch", 1: "src_len"},
        "cross_keys": {1: "batch", 3: "src_len"},
        "cross_values": {1: "batch", 3: "src_len"},
        "src_mask": {0: "batch", 1: "src_len"},
    }
    decoder_axes = {
        "tokens": {0: "batch"},
        "positions": {0: "batch"},
        "self_keys": {1: "batch", 3: "past"},
        "self_values": {1: "batch", 3: "past"},
        "self_mask": {0: "batch", 1: "past_1"},
        **{k: v for k, v in axes.items() if k != "src_tokens"},
        "log_probs": {0: "batch"},
        "present_keys": {1: "batch", 3: "past_1"},
        "present_values": {1: "batch", 3: "past_1"},
    }
    with torch.no_grad():
        # The TorchScript-based exporter keeps the graph close to the module structure and
        # handles a zero-length cache on the first step, which dynamo's shape guards reject.
        torch.onnx.export(
            EncoderGraph(model),
            encoder_args,
            out_dir / "encoder.onnx",
            input_names=ENCODER_INPUTS,
            output_names=ENCODER_OUTPUTS,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
        torch.onnx.export(
            DecoderGraph(model),
            decoder_args,
            out_dir / "decoder.onnx",
            input_names=DECODER_INPUTS,
            output_names=DECODER_OUTPUTS,
            dynamic_axes=decoder_axes,
            opset_version=OPSET,
            dynamo=False,
        )


def quantize_int8(out_dir: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights (activations stay float)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    for name in ("encoder", "decoder"):
        quantize_dynamic(
            out_dir / f"{name}.onnx",
            out_dir / f"{name}.int8.onnx",
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
        )


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def verify_parity(model: Transformer, out_dir: Path, steps: int = 6, seed: int = 0) -> float:
    """Largest |ONNX - PyTorch| over encoder outputs and ``steps`` decoder steps of a padded,
    mixed-length batch, feeding each side its own cache. Raises if above ``PARITY_ATOL``."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [9, 4, 1, 7]
    src = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for row, length in enumerate(lengths):
        src[row, :length] = torch.randint(
            4, model.config.vocab_size, (length,), generator=generator
        )
        src[row, length - 1] = EOS_ID
    encoder, decoder = _session(out_dir / "encoder.onnx"), _session(out_dir / "decoder.onnx")
    worst = 0.0
    with torch.no_grad():
        ck, cv, sm = model.encode_cross(src)
        onnx_ck, onnx_cv, onnx_sm = encoder.run(None, {"src_tokens": src.numpy()})
        worst = max(
            worst,
            float(np.abs(onnx_ck - ck.numpy()).max()),
            float(np.abs(onnx_cv - cv.numpy()).max()),
        )
        if not np.array_equal(onnx_sm, sm.numpy()):
            raise RuntimeError("parity: encoder src_mask differs from PyTorch")
        layers, batch, heads, _, head_dim = ck.shape
        keys = values = torch.zeros(layers, batch, heads, 0, head_dim)
        onnx_keys = onnx_values = keys.numpy()
        tokens = torch.full((batch,), BOS_ID, dtype=torch.long)
        for step in range(steps):
            positions = torch.full((batch,), step, dtype=torch.long)
            self_mask = torch.ones(batch, step + 1, dtype=torch.bool)
            log_probs, k, v = model.decode_step(
                tokens, positions, keys, values, self_mask, ck, cv, sm
            )
            onnx_log_probs, onnx_k, onnx_v = decoder.run(
                None,
                {
                    "tokens": tokens.numpy(),
                    "positions": positions.numpy(),
                    "self_keys": onnx_keys,
                    "self_values": onnx_values,
                    "self_mask": self_mask.numpy(),
                    "cross_keys": onnx_ck,
                    "cross_values": onnx_cv,
                    "src_mask": onnx_sm,
                },
            )
            worst = max(worst, float(np.abs(onnx_log_probs - log_probs.numpy()).max()))
            if not np.array_equal(onnx_log_probs.argmax(-1), log_probs.argmax(-1).numpy()):
                raise RuntimeError(f"parity: greedy choice differs from PyTorch at step {step}")
            worst = max(worst, float(np.abs(onnx_k - k.numpy()).max()))
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


def export_bundle(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    int8: bool = False,
    check_parity: bool = True,
    default_variant: str = "fp32",
    scores: dict[str, Any] | None = None,
) -> Path:
    """Export ``checkpoint`` to a bundle in ``out_dir`` (replaced atomically when it passes)."""
    model, ckpt = load_checkpoint(checkpoint)
    config = model.config
    vocab = Path(ckpt["vocab"])
    if not vocab.is_file():
        raise FileNotFoundError(f"the checkpoint's SentencePiece model {vocab} does not exist")
    data_config = ckpt.get("config", {}).get("data", {})
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
        if int8:
            quantize_int8(staging)
            variants["int8"] = {"encoder": "encoder.int8.onnx", "decoder": "decoder.int8.onnx"}
        if default_variant not in variants:
            raise ValueError(f"default variant {default_variant!r} was not exported")
        shutil.copyfile(vocab, staging / "sentencepiece.model")
        files = sorted(p.name for p in staging.iterdir() if p.is_file())
        manifest = {
            "contract_version": CONTRACT_VERSION,
            "source_lang": data_config.get("source_lang", "en"),
            "target_lang": data_config.get("target_lang", "de"),
            "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
            "model": {**dataclasses.asdict(config), "head_dim": config.head_dim},
            "max_positions": config.max_positions,
            "tokenizer": "sentencepiece.model",
            "variants": variants,
            "default_variant": default_variant,
            "files": {name: sha256_file(staging / name) for name in files},
            "parity_max_abs_diff": worst,
            "training": _training_summary(ckpt),
            "scores": scores or {},
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
