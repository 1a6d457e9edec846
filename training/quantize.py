"""Static int8 graphs for a bundle: every matrix product with a weight becomes an integer one.

Each MatMul's activation input is quantised to uint8 with one scale and zero point that are
constants of the graph, calibrated beforehand from the range the activation takes while the
fp32 graphs translate sample sentences; each weight matrix is quantised per output column.
Each product becomes onnxruntime's ``MatMulIntegerToFloat``, an integer GEMM (VNNI or AMX
where the CPU has it) that also adds the bias.

Why static: the scale of a row's activations must not depend on the other rows of its batch,
or a sentence's translation would change with the traffic around it (``quantize_dynamic``
scales each tensor by its own range, so it does exactly that). Constant scales keep each row's
integer products, and so its log-probs, bit-identical alone and in any batch;
``export.verify_batch_invariance`` checks it on every export. It is also ~1.2x faster than the
weight-only ``MatMulNBits`` graphs it replaced from batch 8 on, at the same BLEU
(docs/benchmarks.md).

Weights use 7 bits (-63..63), as onnxruntime's ``reduce_range`` does: on CPUs without VNNI the
uint8 x int8 kernel adds pairs of products in int16, and 255 * 127 * 2 would overflow it.
A prototype with 8-bit weights scored the same dev BLEU as one with 7 (9.58).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.bundle import decoder_feeds
from training.config import ModelConfig
from training.weights import matmul_weights

log = logging.getLogger(__name__)

WEIGHT_MAX = 63  # 7-bit weights; see the module docstring
CALIBRATION_SENTENCES = 256


def calibration_sources(path: str | Path, encode: Callable[[str], list[int]], max_tokens: int,
                        count: int = CALIBRATION_SENTENCES) -> list[list[int]]:
    """Token ids (``encode``'s, ending in EOS, at most ``max_tokens``) of the first ``count``
    sources of ``path``: a TSV whose first column is the source (train.tsv, shuffled by
    ``prepare``) or one sentence per line."""
    sources: list[list[int]] = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            text = line.rstrip("\n").split("\t", 1)[0].strip()
            if text:
                ids = encode(text)
                sources.append([*ids[: max_tokens - 1], ids[-1]] if len(ids) > max_tokens
                               else ids)
            if len(sources) == count:
                break
    if not sources:
        raise ValueError(f"{path}: no sentences to calibrate the int8 graphs with")
    return sources


def vocabulary_sources(ids: np.ndarray, eos_id: int, count: int = CALIBRATION_SENTENCES,
                       seed: int = 0) -> list[list[int]]:
    """``count`` sequences of 4-40 tokens drawn from ``ids``, each ending in EOS: calibration
    for a model whose training text is not at hand (an imported one). Real sentences
    (``calibration_sources``) give ranges closer to what the service sees."""
    rng = np.random.default_rng(seed)
    return [[*map(int, rng.choice(ids, int(rng.integers(3, 40)))), eos_id] for _ in range(count)]


def _weighted_matmuls(model, weights: set[str]) -> list:
    """The MatMul nodes whose second input is one of the graph's weight matrices (those
    ``training.weights.graph_layout`` declares: not the attention's products of
    activations)."""
    return [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]


class _Ranges:
    """Running [min, max] of chosen tensors of a graph, read as extra graph outputs."""

    def __init__(self, path: Path, weights: set[str]):
        import onnx
        from onnx import TensorProto, helper

        model = onnx.load(str(path))
        self.weights = weights
        self.names = sorted({node.input[0] for node in _weighted_matmuls(model, weights)})
        self.outputs = [output.name for output in model.graph.output]
        for name in self.names:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        self.low = dict.fromkeys(self.names, 0.0)  # the range always holds 0 (zero point)
        self.high = dict.fromkeys(self.names, 0.0)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        values = self.session.run(self.outputs + self.names, feeds)
        for name, value in zip(self.names, values[len(self.outputs):], strict=True):
            self.low[name] = min(self.low[name], float(value.min()))
            self.high[name] = max(self.high[name], float(value.max()))
        return values[: len(self.outputs)]


def calibrate(out_dir: Path, sources: Iterable[Sequence[int]], config: ModelConfig,
              ) -> tuple[_Ranges, _Ranges]:
    """Translate ``sources`` greedily, one at a time (no padding to distort the ranges), with
    the fp32 graphs in ``out_dir``, recording every weighted MatMul input's range."""
    encoder = _Ranges(out_dir / "encoder.onnx", matmul_weights(config, "encoder"))
    decoder = _Ranges(out_dir / "decoder.onnx", matmul_weights(config, "decoder"))
    max_positions, bos_id, eos_id = config.max_positions, config.bos_id, config.eos_id
    for ids in sources:
        cross_keys, cross_values, src_mask, cross_last = encoder.run(
            {"src_tokens": np.asarray([ids], np.int64)}
        )
        layers, _, heads, _, head_dim = cross_keys.shape
        keys = values = np.zeros((layers, 1, heads, 0, head_dim), np.float32)
        token = bos_id
        for step in range(min(2 * len(ids) + 10, max_positions - 1)):
            log_probs, *presents = decoder.run(decoder_feeds(
                np.asarray([token], np.int64), np.asarray([step], np.int64), keys, values,
                cross_keys, cross_values, src_mask, cross_last,
            ))
            presents = presents[: 2 * layers]  # then the cross caches, passed through
            keys, values = np.stack(presents[0::2]), np.stack(presents[1::2])
            token = int(log_probs[0].argmax())
            if token == eos_id:
                break
    return encoder, decoder


def _bias_adds(graph, products: set[str], weights: dict) -> dict[str, object]:
    """For each product in ``products`` read only by an ``Add`` of a 1-D weight (its bias),
    that Add node: the integer product takes the bias itself, one kernel fewer per layer."""
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {output.name for output in graph.output}
    adds = {}
    for product in products:
        add = readers.get(product, [])
        if len(add) != 1 or add[0].op_type != "Add" or product in outputs:
            continue
        bias = [name for name in add[0].input if name != product]
        if len(bias) == 1 and bias[0] in weights and len(weights[bias[0]].dims) == 1:
            adds[product] = add[0]
    return adds


def quantize_graph(source: Path, target: Path, ranges: _Ranges) -> None:
    """Write ``target``: ``source`` with each weighted MatMul (and the bias Add after it, where
    there is one) replaced by a ``MatMulIntegerToFloat`` of int8 weights and an activation
    quantised at its calibrated range (see the module docstring).

    The integer nodes are written directly rather than as the QDQ pattern onnxruntime would
    fuse into the same kernel, because its fusion leaves each bias as an Add of its own: at
    batch 1 a decoder step is ~130 kernels of a few microseconds each, so one fewer per
    projection is worth having."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    targets = {node.output[0] for node in _weighted_matmuls(model, ranges.weights)}
    biases = _bias_adds(graph, targets, weights)
    folded = {id(add) for add in biases.values()}
    nodes, inits, quantized = [], [], set()
    for node in graph.node:
        if id(node) in folded:
            continue
        if not node.output or node.output[0] not in targets:
            nodes.append(node)
            continue
        x, w_name = node.input[0], node.input[1]
        if x not in quantized:  # one QuantizeLinear per activation, however many MatMuls read it
            low, high = ranges.low[x], ranges.high[x]
            scale = max(high - low, 1e-8) / 255.0
            zero = int(np.clip(round(-low / scale), 0, 255))
            inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{x}_scale"),
                      numpy_helper.from_array(np.array(zero, np.uint8), f"{x}_zero")]
            nodes.append(helper.make_node("QuantizeLinear", [x, f"{x}_scale", f"{x}_zero"],
                                          [f"{x}_q"], name=f"{x}_q"))
            quantized.add(x)
        if w_name not in quantized:  # likewise one int8 copy per weight
            w = numpy_helper.to_array(weights[w_name]).astype(np.float32)
            w_scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / WEIGHT_MAX
            w_q = np.clip(np.round(w / w_scale), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
            inits += [numpy_helper.from_array(w_q, f"{w_name}_q"),
                      numpy_helper.from_array(w_scale.astype(np.float32), f"{w_name}_scale")]
            quantized.add(w_name)
        add = biases.get(node.output[0])
        inputs = [f"{x}_q", f"{w_name}_q", f"{x}_scale", f"{w_name}_scale", f"{x}_zero"]
        if add is not None:
            bias = next(name for name in add.input if name != node.output[0])
            inputs += ["", bias]  # no weight zero point (symmetric), then the bias
        output = add.output[0] if add is not None else node.output[0]
        nodes.append(helper.make_node("MatMulIntegerToFloat", inputs, [output], name=node.name,
                                      domain="com.microsoft"))
    used = {name for node in nodes for name in node.input}
    kept = [init for init in graph.initializer if init.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + inits)
    if not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(target))


def quantize_int8(out_dir: Path, sources: Sequence[Sequence[int]], config: ModelConfig,
                  ) -> None:
    """Write ``encoder.int8.onnx`` and ``decoder.int8.onnx`` beside the fp32 graphs of a
    model of ``config``."""
    encoder, decoder = calibrate(out_dir, sources, config)
    log.info("int8: calibrated on %d sentences", len(sources))
    quantize_graph(out_dir / "encoder.onnx", out_dir / "encoder.int8.onnx", encoder)
    quantize_graph(out_dir / "decoder.onnx", out_dir / "decoder.int8.onnx", decoder)
