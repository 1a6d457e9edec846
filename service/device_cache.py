"""A batch's caches in the memory of the device the decoder runs on (CUDA), so that a step
copies none of them between host and device.

``service.cache.BatchCache`` keeps its buffers in numpy arrays, which onnxruntime reads and
writes in place on the CPU. On a GPU the same buffers live in ``OrtValue``s allocated on the
device; the decoder's IO binding points each cache input and its present output at the same
device memory (its first ``rows`` rows, a contiguous prefix), so GroupQueryAttention appends
this step's key/value there as it does on the CPU. What numpy does to the host buffers
between steps, small onnxruntime graphs do on the device (``DeviceOps``):

* ``move`` (Gather, then ScatterND): rows take other rows' caches (beams their parents',
  compaction dropping holes), in place;
* ``write`` (ScatterND): a newcomer's cross keys/values and ``cross_last`` written into its
  rows, in place (the encoder's outputs come to the host once per sentence and go back to the
  device padded to the batch's source width: a copy per sentence, not per step);
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
    """The graphs that move, write and resize cache buffers on ``device``, for buffers of
    ``dtype``; built with ``onnx`` (the `gpu` extra brings it). ``move`` and ``write`` take
    every buffer a change concerns in one run: a run costs tens of microseconds on a GPU, and
    a beam step moves 2 x layers buffers."""

    def __init__(self, providers: list[str], device: str, dtype: np.dtype) -> None:
        self.providers, self.device, self.device_id = providers, device, 0
        self.dtype = np.dtype(dtype)
        self._sessions: dict[tuple[str, int], ort.InferenceSession] = {}

    def zeros(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, self.dtype), self.device,
                                                self.device_id)

    def _session(self, name: str, count: int) -> ort.InferenceSession:
        if (name, count) not in self._sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.log_severity_level = 3
            graph = _graph(name, count, self.dtype).SerializeToString()
            self._sessions[name, count] = ort.InferenceSession(graph, options,
                                                               providers=self.providers)
        return self._sessions[name, count]

    def _run(self, name: str, buffers: list[ort.OrtValue], in_place: bool,
             **inputs: np.ndarray) -> list[ort.OrtValue]:
        session = self._session(name, len(buffers))
        binding = session.io_binding()
        for i, buffer in enumerate(buffers):
            binding.bind_ortvalue_input(f"x_{i}", buffer)
            if in_place:  # y_i is x_i's memory
                binding.bind_output(f"y_{i}", self.device, self.device_id, self.dtype,
                                    buffer.shape(), buffer.data_ptr())
            else:
                binding.bind_output(f"y_{i}", self.device, self.device_id)
        for name_, value in inputs.items():
            binding.bind_cpu_input(name_, np.ascontiguousarray(value))
        session.run_with_iobinding(binding)
        return buffers if in_place else binding.get_outputs()

    def move(self, buffers: list[ort.OrtValue], moved: np.ndarray, sources: np.ndarray,
             ) -> None:
        """Rows ``moved`` of each buffer take rows ``sources``' values, in place: each buffer's
        rows ``sources`` are gathered before ScatterND writes them over rows ``moved`` (it
        copies its input to its output first only where the two differ)."""
        self._run("move", buffers, True, moved=moved.astype(np.int64)[:, None],
                  sources=sources.astype(np.int64))

    def write(self, buffers: list[ort.OrtValue], rows: np.ndarray,
              updates: list[np.ndarray]) -> None:
        """Rows ``rows`` of ``buffers[i]`` become ``updates[i]`` (host arrays), in place."""
        arrays = {f"updates_{i}": u.astype(self.dtype, copy=False) for i, u in enumerate(updates)}
        self._run("write", buffers, True, rows=rows.astype(np.int64)[:, None], **arrays)

    def resize(self, buffer: ort.OrtValue, shape: tuple[int, ...]) -> ort.OrtValue:
        """``buffer`` cut or zero-padded at the end of each axis to ``shape``."""
        kept = np.minimum(buffer.shape(), shape).astype(np.int64)
        pads = np.concatenate([np.zeros(len(shape), np.int64), np.asarray(shape) - kept])
        return self._run("resize", [buffer], False, starts=np.zeros(len(shape), np.int64),
                         ends=kept, pads=pads)[0]


def _graph(name: str, count: int, dtype: np.dtype):
    """``count`` buffers ``x_i`` in, ``y_i`` out: ``move``, ``write`` or ``resize`` (one)."""
    from onnx import TensorProto, helper

    element = helper.np_dtype_to_tensor_dtype(dtype)

    def tensor(name: str, kind: int = element):
        return helper.make_tensor_value_info(name, kind, None)  # any shape

    indices = {"move": ["moved", "sources"], "write": ["rows"],
               "resize": ["starts", "ends", "pads"]}[name]
    inputs = [tensor(f"x_{i}") for i in range(count)]
    inputs += [tensor(index, TensorProto.INT64) for index in indices]
    nodes = []
    for i in range(count):
        x, y = f"x_{i}", f"y_{i}"
        if name == "move":
            nodes += [helper.make_node("Gather", [x, "sources"], [f"taken_{i}"], axis=0),
                      helper.make_node("ScatterND", [x, "moved", f"taken_{i}"], [y])]
        elif name == "write":
            inputs.append(tensor(f"updates_{i}"))
            nodes.append(helper.make_node("ScatterND", [x, "rows", f"updates_{i}"], [y]))
        else:
            nodes += [helper.make_node("Slice", [x, "starts", "ends"], [f"kept_{i}"]),
                      helper.make_node("Pad", [f"kept_{i}", "pads"], [y])]
    graph = helper.make_graph(nodes, f"cache_{name}", inputs,
                              [tensor(f"y_{i}") for i in range(count)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


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
        updates = [np.pad(cache[layer][picks], pad) for cache in (keys, values)
                   for layer in range(self.layers)]
        self.ops.write([*self.cross_keys, *self.cross_values, self.cross_last], rows,
                       [*updates, last[picks]])
        self.src_mask[rows, :width] = mask[picks]
        self.src_mask[rows, width:] = False

    def gather(self, order: np.ndarray, columns: int, cross: bool) -> None:
        count = len(order)
        moved = np.flatnonzero(order != np.arange(count))
        if len(moved):  # all columns: on a GPU the copy costs less than cutting it
            buffers = [*self.self_keys, *self.self_values]
            if cross:
                buffers += [*self.cross_keys, *self.cross_values, self.cross_last]
                self.src_mask[moved] = self.src_mask[order[moved]]
            self.ops.move(buffers, moved, order[moved])
        self.set_rows(count)

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
