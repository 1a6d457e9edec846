"""Cross-attention of a beam search: every beam reading its own copy of its source's keys and
values (the decoder graph as exported) against the beams of a sentence sharing one copy.

    python bench/cross_attention.py [--lengths 98,98,19,18,13,12,12,12] [--beam 4]
        [--heads 8] [--head-dim 64] [--layers 6] [--steps 300]

Both run onnxruntime's ``com.microsoft.GroupQueryAttention`` as ``training/export.py``'s
decoder does (each row's cache length its count of source tokens, its last source position
appended again), on one thread, over ``--layers`` layers of caches of their own, bound in
place as ``service.batch`` binds them:

* per row: one batch entry per beam, ``num_heads = kv_num_heads = heads``;
* shared: one batch entry per sentence, its beams as query heads ordered head-major
  (``num_heads = heads * beam``, ``kv_num_heads = heads``), so query head ``h * beam + b``
  reads key/value head ``h``.

Printed: whether the shared layout gives every beam bitwise the context of its own copy, and
microseconds per decoder step (all layers) for each. The default lengths are the source
pieces of the longer batch of 8 in ``bench/decode.py --import`` over the first 16 test
sentences (``bench/random_marian.py``'s source vocabulary).

A script that prints; it never asserts and is not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.placeholders import cpu_model, head_commit  # noqa: E402


def _session(query_heads: int, kv_heads: int, head_dim: int, layers: int,
             width: int) -> ort.InferenceSession:
    F, I32 = TensorProto.FLOAT, TensorProto.INT32
    info = helper.make_tensor_value_info
    inputs = [info("query", F, ["batch", 1, query_heads * head_dim]),
              info("last_position", I32, ["batch"]), info("width", I32, [])]
    outputs, nodes = [], []
    cache = ["batch", kv_heads, width, head_dim]
    for i in range(layers):
        inputs += [info(f"last_key_{i}", F, ["batch", 1, kv_heads * head_dim]),
                   info(f"last_value_{i}", F, ["batch", 1, kv_heads * head_dim]),
                   info(f"keys_{i}", F, cache), info(f"values_{i}", F, cache)]
        outputs += [info(f"context_{i}", F, ["batch", 1, query_heads * head_dim]),
                    info(f"present_keys_{i}", F, cache), info(f"present_values_{i}", F, cache)]
        nodes.append(helper.make_node(
            "GroupQueryAttention",
            ["query", f"last_key_{i}", f"last_value_{i}", f"keys_{i}", f"values_{i}",
             "last_position", "width"],
            [f"context_{i}", f"present_keys_{i}", f"present_values_{i}"],
            domain="com.microsoft", num_heads=query_heads, kv_num_heads=kv_heads))
    model = helper.make_model(
        helper.make_graph(nodes, "cross_attention", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, query: np.ndarray, keys: list[np.ndarray],
         values: list[np.ndarray], last: np.ndarray, steps: int) -> tuple[list[np.ndarray], float]:
    """Each layer's context, and microseconds per call over ``steps`` calls."""
    entries = query.shape[0]
    rows = np.arange(entries)
    binding = session.io_binding()
    binding.bind_cpu_input("query", query)
    binding.bind_cpu_input("last_position", last)
    binding.bind_cpu_input("width", np.array(keys[0].shape[2], np.int32))
    held, contexts = [], []
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        # The row's last source position's key/value, appended again (written back unchanged)
        for name, array in (("key", k), ("value", v)):
            held.append(np.ascontiguousarray(array[rows, :, last].reshape(entries, 1, -1)))
            binding.bind_cpu_input(f"last_{name}_{i}", held[-1])
        for name, array in (("keys", k), ("values", v)):
            value = ort.OrtValue.ortvalue_from_numpy(array.copy())
            held.append(value)
            binding.bind_ortvalue_input(f"{name}_{i}", value)
            binding.bind_ortvalue_output(f"present_{name}_{i}", value)
        contexts.append(np.zeros(query.shape, np.float32))  # written by each call
        binding.bind_ortvalue_output(f"context_{i}",
                                     ort.OrtValue.ortvalue_from_numpy(contexts[-1]))
    for _ in range(10):
        session.run_with_iobinding(binding)
    start = time.perf_counter()
    for _ in range(steps):
        session.run_with_iobinding(binding)
    return contexts, (time.perf_counter() - start) / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="98,98,19,18,13,12,12,12",
                        help="source pieces of each sentence, EOS included")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    H, D, B, n = args.heads, args.head_dim, args.beam, len(lengths)
    width = max(lengths)
    rng = np.random.default_rng(0)
    keys = [rng.standard_normal((n, H, width, D), np.float32) for _ in range(args.layers)]
    values = [rng.standard_normal((n, H, width, D), np.float32) for _ in range(args.layers)]
    queries = rng.standard_normal((n, B, H * D), np.float32)  # each sentence's beams
    last = np.array([length - 1 for length in lengths], np.int32)

    def per_beam(a: np.ndarray) -> np.ndarray:
        return np.repeat(a, B, axis=0)

    own, own_us = _run(_session(H, H, D, args.layers, width), queries.reshape(n * B, 1, H * D),
                       [per_beam(k) for k in keys], [per_beam(v) for v in values],
                       per_beam(last), args.steps)
    head_major = queries.reshape(n, B, H, D).transpose(0, 2, 1, 3).reshape(n, 1, H * B * D)
    shared, shared_us = _run(_session(H * B, H, D, args.layers, width), head_major, keys, values,
                             last, args.steps)
    same = all(np.array_equal(a.reshape(n, B, H, D), b.reshape(n, H, B, D).transpose(0, 2, 1, 3))
               for a, b in zip(own, shared, strict=True))
    cache_mb = sum(lengths) * args.layers * 2 * H * D * 4 / 1e6
    print(f"{cpu_model()}, onnxruntime {ort.__version__}, commit {head_commit()}")
    print(f"{n} sentences of {sum(lengths)} source pieces, beam {B}, {args.layers} layers of "
          f"{H} heads x {D}; one thread")
    print(f"bitwise the same context for every beam: {same}")
    print(f"a copy per beam:     {own_us:6.0f} us a step, {cache_mb * B:5.1f} MB of keys/values")
    print(f"a copy per sentence: {shared_us:6.0f} us a step, {cache_mb:5.1f} MB of keys/values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
