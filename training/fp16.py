"""fp16 graphs for a bundle: the fp32 graphs with their weights, activations and caches in half
precision, for onnxruntime's CUDA provider.

Why: the decoder's attention is ``com.microsoft.GroupQueryAttention``, whose CUDA kernels take
fp16 or bf16 only; with the fp32 graphs that node runs on the CPU provider beside the CUDA one,
copying its caches to the host and back every step. In fp16 the whole step runs on the device,
and the KV caches, which the service keeps there (``service.device_cache``), take half the
memory.

The conversion is onnxruntime's own (``onnxruntime.transformers.float16``, the converter its
transformer optimiser uses), applied to the fp32 graphs once they have passed the PyTorch parity
check, rather than a second graph builder: one set of graph code, and a bundle's fp32 graphs can
be converted without the checkpoint (``translate-train fp16 BUNDLE``). Every float input and
output becomes float16 (the cross keys/values the encoder returns, every cache the decoder
reads and writes, ``cross_last``), except ``log_probs``: the decoder's last nodes, the
never-generate mask's Add and the log-softmax, stay in float32 so the search compares
log-probs at full precision (in fp16 a log-prob of -20 is only resolved to 1/64, and the mask's
-3.4e38 does not fit). onnxruntime's fp16 kernels for LayerNorm, softmax and attention
accumulate in float32 internally, so nothing else needs blocking (docs/benchmarks.md has the
parity figures).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.bundle import MANIFEST, decoder_feeds, write_manifest

log = logging.getLogger(__name__)

ENCODER, DECODER = "encoder.fp16.onnx", "decoder.fp16.onnx"
# The decoder's last nodes (training.export._fused_decoder_graph), kept in float32.
FP32_NODES = ("logits_masked", "logits", "log_probs")
FP32_OUTPUTS = ("log_probs",)
# Largest |fp16 - fp32| log-prob of a token the fp32 graphs rank in their top ``TOP`` a step
# that export accepts: fp16 rounding moves them by a few hundredths (docs/benchmarks.md);
# an overflow or a wrongly converted node moves them by whole units.
PARITY_LIMIT = 0.25
TOP = 8


def convert_graph(source: Path, target: Path, fp32_nodes: tuple[str, ...] = (),
                  fp32_outputs: tuple[str, ...] = ()) -> None:
    """Write ``target``: ``source`` in float16 but for ``fp32_nodes`` and ``fp32_outputs``."""
    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(source))
    # The converter casts a kept-fp32 node's inputs back to float32 where it knows their type;
    # onnx's shape inference cannot type the outputs of onnxruntime's contrib ops, so say it.
    produced = {name for node in model.graph.node for name in node.output}
    typed = {info.name for info in model.graph.value_info}
    for node in model.graph.node:
        if node.name in fp32_nodes:
            for name in node.input:
                if name in produced and name not in typed:
                    model.graph.value_info.append(
                        helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
                    typed.add(name)
    half = convert_float_to_float16(
        model, keep_io_types=list(fp32_outputs), op_block_list=DEFAULT_OP_BLOCK_LIST,
        node_block_list=list(fp32_nodes),
    )
    _drop_round_trips(half.graph, set(fp32_nodes))
    half.producer_name = "training.fp16"
    onnx.save(half, str(target))


def _drop_round_trips(graph, fp32_nodes: set[str]) -> None:
    """Remove the Cast to float16 the converter puts after each kept-fp32 node where only
    Casts back to float32 read it: between consecutive kept nodes, and before a float32
    output, it would only round the values to fp16 on their way."""
    from onnx import TensorProto

    def to(node) -> int:
        return next(a.i for a in node.attribute if a.name == "to")

    producers = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {output.name for output in graph.output}
    dropped, renames = set(), {}
    for cast in graph.node:
        if cast.op_type != "Cast" or to(cast) != TensorProto.FLOAT16:
            continue
        source = producers.get(cast.input[0])
        back = readers.get(cast.output[0], [])
        if (source is None or source.name not in fp32_nodes or not back
                or cast.output[0] in outputs
                or any(n.op_type != "Cast" or to(n) != TensorProto.FLOAT for n in back)):
            continue
        dropped.update(id(n) for n in (cast, *back))
        for node in back:
            if node.output[0] in outputs:  # the kept node writes the graph output itself
                source.output[list(source.output).index(cast.input[0])] = node.output[0]
            else:
                renames[node.output[0]] = cast.input[0]
    kept = [node for node in graph.node if id(node) not in dropped]
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = renames.get(name, name)
    del graph.node[:]
    graph.node.extend(kept)


def convert_fp16(out_dir: Path) -> dict[str, str]:
    """Write ``encoder.fp16.onnx`` and ``decoder.fp16.onnx`` beside the fp32 graphs of
    ``out_dir``; returns the manifest's entry for the variant."""
    convert_graph(out_dir / "encoder.onnx", out_dir / ENCODER)
    convert_graph(out_dir / "decoder.onnx", out_dir / DECODER, FP32_NODES, FP32_OUTPUTS)
    return {
        "encoder": ENCODER,
        "decoder": DECODER,
        "precision": "float16 weights, activations and caches; the log-softmax and log_probs "
                     "float32 (for onnxruntime's CUDA provider)",
    }


def random_batch(vocab_size: int, special_ids: dict[str, int], lengths: list[int],
                 seed: int = 0) -> np.ndarray:
    """A padded batch of random sources of ``lengths`` tokens, each ending in EOS."""
    rng = np.random.default_rng(seed)
    ordinary = np.setdiff1d(np.arange(vocab_size), list(special_ids.values()))
    batch = np.full((len(lengths), max(lengths)), special_ids["pad"], np.int64)
    for row, length in enumerate(lengths):
        batch[row, : length - 1] = rng.choice(ordinary, length - 1)
        batch[row, length - 1] = special_ids["eos"]
    return batch


def checked_fp16(out_dir: Path, source_vocab_size: int, special_ids: dict[str, int],
                 ) -> dict[str, Any]:
    """``convert_fp16`` and ``compare`` on random sources, raising if any fp32 top-``TOP``
    log-prob moved more than ``PARITY_LIMIT``; the variant's manifest entry with the figures."""
    variant = convert_fp16(out_dir)
    sources = random_batch(source_vocab_size, special_ids, [9, 4, 1, 7, 12, 3])
    figures = compare(out_dir, sources, special_ids["bos"])
    log.info("fp16 against fp32: %s", figures)
    if not figures["max_abs_log_prob_top"] <= PARITY_LIMIT:  # also catches NaN
        raise RuntimeError(f"fp16: log-probs differ from fp32 by "
                           f"{figures['max_abs_log_prob_top']:.3g} > {PARITY_LIMIT}")
    return {**variant, "parity_vs_fp32": figures}


def add_fp16_variant(bundle_dir: str | Path) -> Path:
    """Add the fp16 variant to an existing bundle from its fp32 graphs (no checkpoint needed):
    the graphs beside the others, the variant and their checksums in the manifest. A bundle
    that has the variant is left as it is."""
    directory = Path(bundle_dir)
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    if "fp16" in manifest["variants"]:
        log.info("%s already has the fp16 variant", directory)
        return directory
    if "fp32" not in manifest["variants"]:
        raise ValueError(f"{directory}: no fp32 variant to convert")
    model = manifest["model"]
    vocab_size = model.get("source_vocab_size") or model["vocab_size"]
    manifest["variants"]["fp16"] = checked_fp16(directory, vocab_size, manifest["special_ids"])
    write_manifest(directory, manifest, added=(ENCODER, DECODER))
    return directory


def _session(path: Path, providers: list[str]) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=providers)


def _cast(feeds: dict[str, Any], session: ort.InferenceSession) -> dict[str, Any]:
    """``feeds`` in the float type ``session`` takes each in."""
    types = {arg.name: arg.type for arg in session.get_inputs()}
    return {name: value.astype(np.float16) if types[name] == "tensor(float16)" else value
            for name, value in feeds.items()}


def compare(out_dir: Path, sources: np.ndarray, bos_id: int, steps: int = 8,
            eos_id: int | None = None, providers: list[str] | None = None,
            ) -> dict[str, float]:
    """The fp16 graphs against the fp32 ones (on onnxruntime's CPU provider unless
    ``providers`` says), both fed the fp32 greedy choices (teacher forcing) over ``steps``
    decoder steps of the padded batch ``sources``, a row counting until fp32 chose ``eos_id``:
    the largest |Δ log-prob| over each step's fp32 top ``TOP`` tokens and over the whole
    vocabulary, the share of steps whose greedy choice agrees and the steps counted."""
    providers = providers or ["CPUExecutionProvider"]
    sessions = {name: (_session(out_dir / encoder, providers),
                       _session(out_dir / decoder, providers))
                for name, encoder, decoder in (("fp32", "encoder.onnx", "decoder.onnx"),
                                               ("fp16", ENCODER, DECODER))}
    state: dict[str, dict[str, Any]] = {}
    for name, (encoder, _) in sessions.items():
        cross_keys, cross_values, src_mask, last = encoder.run(None, {"src_tokens": sources})
        layers, batch, heads, _, head_dim = cross_keys.shape
        empty = np.zeros((layers, batch, heads, 0, head_dim), cross_keys.dtype)
        state[name] = {"self_keys": empty, "self_values": empty, "cross_keys": cross_keys,
                       "cross_values": cross_values, "src_mask": src_mask, "cross_last": last}
    tokens = np.full(len(sources), bos_id, np.int64)
    live = np.ones(len(sources), bool)
    top = whole = 0.0
    agree = total = 0
    for step in range(steps):
        positions = np.full(len(sources), step, np.int64)
        log_probs = {}
        for name, (_, decoder) in sessions.items():
            out, *presents = decoder.run(None, _cast(
                decoder_feeds(tokens, positions, **state[name]), decoder))
            layers = len(presents) // 4
            state[name]["self_keys"] = np.stack(presents[0 : 2 * layers : 2])
            state[name]["self_values"] = np.stack(presents[1 : 2 * layers : 2])
            log_probs[name] = out.astype(np.float32)
        reference, half = log_probs["fp32"][live], log_probs["fp16"][live]
        best = np.argsort(-reference, axis=1)[:, :TOP]
        top = max(top, float(np.abs(np.take_along_axis(reference - half, best, 1)).max()))
        finite = reference > -1e4  # not the never-generate mask's tokens
        whole = max(whole, float(np.abs(reference - half)[finite].max()))
        agree += int((reference.argmax(1) == half.argmax(1)).sum())
        total += int(live.sum())
        tokens = log_probs["fp32"].argmax(1).astype(np.int64)
        if eos_id is not None:
            live &= tokens != eos_id
            if not live.any():
                break
    return {"max_abs_log_prob_top": top, "max_abs_log_prob": whole,
            "greedy_agreement": agree / total, "steps": total}
