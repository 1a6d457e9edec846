"""A batch's caches in the memory of the device the decoder runs on (CUDA), so that a step
copies none of them between host and device.

``service.cache.BatchCache`` keeps its buffers in numpy arrays, which onnxruntime reads and
writes in place on the CPU. On a GPU the same buffers live in ``OrtValue``s allocated on the
device; the decoder's IO binding points each cache input and its present output at the same
device memory (its first ``rows`` rows, a contiguous prefix), so GroupQueryAttention appends
this step's key/value there as it does on the CPU. What numpy does to the host buffers
between steps, three one-node onnxruntime graphs do on the device (``DeviceOps``):

* ``gather``, then ``scatter``: rows take other rows' caches (beams their parents',
  compaction dropping holes), in place;
* ``scatter``: a newcomer's cross keys/values and ``cross_last`` written into its rows, in
  place (the encoder's outputs come to the host once per sentence and go back to the device
  padded to the batch's source width: a copy per sentence, not per step);
* ``resize``: a buffer with more or fewer rows or columns, keeping what fits, zeros after.

``resize`` returns a new buffer, so it rebinds, as a shape change does on the CPU. The
log-probs (read by the search) and the source mask (a byte a position) stay in host memory;
onnxruntime copies them with each step.

The same code runs on the CPU provider with ``device="cpu"`` (``Engine(..., device_cache=
True)``), which is how the tests check it decodes exactly what the numpy buffers do.
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort

from service.cache import BatchCache


class DeviceOps:
    """The one-node graphs that gather, scatter and resize cache buffers on ``device``, for
    buffers of ``dtype``. Built with ``onnx`` (the `gpu` extra brings it)."""

    def __init__(self, providers: list[str], device: str, dtype: np.dtype) -> None:
        self.device, self.device_id, self.dtype = device, 0, np.dtype(dtype)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.sessions = {
            name: ort.InferenceSession(graph.SerializeToString(), options, providers=providers)
            for name, graph in _graphs(self.dtype).items()
        }

    def zeros(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, self.dtype), self.device,
                                                self.device_id)

    def _run(self, name: str, x: ort.OrtValue, in_place: bool = False,
             **inputs: np.ndarray | ort.OrtValue) -> ort.OrtValue:
        binding = self.sessions[name].io_binding()
        binding.bind_ortvalue_input("x", x)
        for key, value in inputs.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(key, value)
            else:
                binding.bind_cpu_input(key, np.ascontiguousarray(value))
        if in_place:
            binding.bind_output("y", self.device, self.device_id, self.dtype, x.shape(),
                                x.data_ptr())
        else:
            binding.bind_output("y", self.device, self.device_id)
        self.sessions[name].run_with_iobinding(binding)
        return x if in_place else binding.get_outputs()[0]

    def gather(self, x: ort.OrtValue, rows: np.ndarray) -> ort.OrtValue:
        """Row ``i`` of the result is row ``rows[i]`` of ``x``."""
        return self._run("gather", x, rows=rows.astype(np.int64))

    def scatter(self, x: ort.OrtValue, rows: np.ndarray,
                updates: np.ndarray | ort.OrtValue) -> None:
        """Replace rows ``rows`` of ``x`` by ``updates`` (a host array or a device value), in
        place: ScatterND copies its input to its output first only where they differ."""
        if isinstance(updates, np.ndarray):
            updates = updates.astype(self.dtype, copy=False)
        self._run("scatter", x, in_place=True, rows=rows.astype(np.int64)[:, None],
                  updates=updates)

    def resize(self, x: ort.OrtValue, shape: tuple[int, ...]) -> ort.OrtValue:
        """``x`` cut or zero-padded at the end of each axis to ``shape``."""
        kept = np.minimum(x.shape(), shape).astype(np.int64)
        pads = np.concatenate([np.zeros(len(shape), np.int64), np.asarray(shape) - kept])
        return self._run("resize", x, starts=np.zeros(len(shape), np.int64), ends=kept,
                         pads=pads)


def _graphs(dtype: np.dtype) -> dict:
    from onnx import TensorProto, helper

    element = helper.np_dtype_to_tensor_dtype(dtype)
    x, y = (helper.make_tensor_value_info(name, element, None) for name in ("x", "y"))

    def index(name: str):
        return helper.make_tensor_value_info(name, TensorProto.INT64, None)

    def model(nodes: list, inputs: list):
        graph = helper.make_graph(nodes, "cache_op", [x, *inputs], [y])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                                 ir_version=9)

    updates = helper.make_tensor_value_info("updates", element, None)
    return {
        "gather": model([helper.make_node("Gather", ["x", "rows"], ["y"], axis=0)],
                        [index("rows")]),
        "scatter": model([helper.make_node("ScatterND", ["x", "rows", "updates"], ["y"])],
                         [index("rows"), updates]),
        "resize": model([helper.make_node("Slice", ["x", "starts", "ends"], ["kept"]),
                         helper.make_node("Pad", ["kept", "pads"], ["y"])],
                        [index("starts"), index("ends"), index("pads")]),
    }


class DeviceCache(BatchCache):
    """``BatchCache`` with the caches and ``cross_last`` in device memory (module docstring)."""

    def __init__(self, ops: DeviceOps, layers: int, heads: int, head_dim: int, vocab: int,
                 max_columns: int) -> None:
        super().__init__(layers, heads, head_dim, vocab, max_columns, ops.dtype)
        self.ops = ops
        # Placeholders of no rows, in host memory: only their shapes are read before the
        # first reserve allocates on the device.
        empty = ort.OrtValue.ortvalue_from_numpy(self.self_keys[0])
        self.self_keys = [empty] * layers
        self.self_values = [empty] * layers
        self.cross_keys = [empty] * layers
        self.cross_values = [empty] * layers
        self.cross_last = ort.OrtValue.ortvalue_from_numpy(self.cross_last)

    @property
    def columns(self) -> int:
        return self.self_keys[0].shape()[2]

    def _resized(self, buffer: ort.OrtValue, shape: tuple[int, ...], zeroed: bool = True,
                 ) -> ort.OrtValue:
        if not self.rows:  # nothing to keep
            return self.ops.zeros(shape)
        return self.ops.resize(buffer, shape)

    def write_source(self, rows: np.ndarray, encoded: tuple[np.ndarray, ...],
                     picks: np.ndarray) -> None:
        keys, values, mask, last = encoded
        width = mask.shape[1]
        pad = [(0, 0), (0, 0), (0, self.src_width - width), (0, 0)]
        for layer in range(self.layers):
            self.ops.scatter(self.cross_keys[layer], rows, np.pad(keys[layer][picks], pad))
            self.ops.scatter(self.cross_values[layer], rows, np.pad(values[layer][picks], pad))
        self.ops.scatter(self.cross_last, rows, last[picks])
        self.src_mask[rows, :width] = mask[picks]
        self.src_mask[rows, width:] = False

    def _move(self, buffer: ort.OrtValue, moved: np.ndarray, sources: np.ndarray,
              columns: int | None = None) -> None:
        """The rows ``sources`` gathered first, then written over rows ``moved`` in place (all
        columns: on a GPU the copy is cheaper than cutting it)."""
        self.ops.scatter(buffer, moved, self.ops.gather(buffer, sources))

    def bind(self, binding: ort.IOBinding) -> None:
        """Each cache's first ``rows`` rows as the input and the present output both: the
        same device memory, written in place."""
        ops = self.ops

        def bind_rows(value: ort.OrtValue, name: str, output: str | None = None) -> None:
            shape = [self.rows, *value.shape()[1:]]
            binding.bind_input(name, ops.device, ops.device_id, ops.dtype, shape,
                               value.data_ptr())
            if output:
                binding.bind_output(output, ops.device, ops.device_id, ops.dtype, shape,
                                    value.data_ptr())

        for layer in range(self.layers):
            bind_rows(self.self_keys[layer], f"self_keys_{layer}", f"present_keys_{layer}")
            bind_rows(self.self_values[layer], f"self_values_{layer}",
                      f"present_values_{layer}")
            bind_rows(self.cross_keys[layer], f"cross_keys_{layer}",
                      f"present_cross_keys_{layer}")
            bind_rows(self.cross_values[layer], f"cross_values_{layer}",
                      f"present_cross_values_{layer}")
        bind_rows(self.cross_last, "cross_last")
        self._bind_host(binding)


@functools.cache  # one probe a process
def cuda_runs() -> bool:
    """Whether onnxruntime runs a graph on a CUDA device here: onnxruntime-gpu lists its CUDA
    provider even where there is no GPU (a session then falls back to the CPU)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in "xy")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    return session.get_providers()[0] == "CUDAExecutionProvider"
