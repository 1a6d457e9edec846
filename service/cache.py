"""The decoder's caches for one batch of rows, in buffers the graph reads and writes in place.

Every attention in the decoder graph is onnxruntime's GroupQueryAttention, which reads each
row's own number of cache columns and, when its cache output is bound to the very buffer of
its cache input (onnxruntime's shared past/present buffers), writes this step's key/value into
it instead of copying the whole cache into a new one. So the buffers here live as long as the
batch, with spare rows and columns, and are bound once (``bind``) until their shape changes:

* self keys/values, per layer [rows, heads, columns, head_dim]: a row's ``position`` earlier
  tokens in columns 0 .. position - 1 (the ONNX contract); the columns double when the longest
  history needs more (from ``MIN_COLUMNS``, at most the model's positions);
* cross keys/values, per layer [rows, heads, source width, head_dim], the source mask and
  ``cross_last`` [rows, 1, layers * 2 * d_model]: written once when a sentence joins; each
  row's real length is its count of mask positions;
* log-probs [rows, vocab], the step's output.

Arrays bound to onnxruntime are views of the first ``rows`` rows of each buffer: contiguous,
so onnxruntime reads and writes numpy's memory directly.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort

MIN_COLUMNS = 32
MIN_ROWS = 8
_versions = itertools.count(1)  # unique across caches: a binding records the one it holds


def _grown(buffer: np.ndarray, rows: int, shape: tuple[int, ...], zeroed: bool = True,
           ) -> np.ndarray:
    """A buffer of ``shape`` holding ``buffer``'s first ``rows`` rows (and as much of its
    other axes as fits); the rest zeroed, or left as it comes when nothing reads it."""
    grown = np.zeros(shape, buffer.dtype) if zeroed else np.empty(shape, buffer.dtype)
    kept = tuple(slice(0, min(a, b)) for a, b in zip(buffer.shape[1:], shape[1:], strict=True))
    grown[(slice(0, rows), *kept)] = buffer[(slice(0, rows), *kept)]
    return grown


class BatchCache:
    """``dtype`` is the graph's cache type (float32, or float16 for the fp16 variant);
    log-probs are float32 whatever the graph computes in."""

    def __init__(self, layers: int, heads: int, head_dim: int, vocab: int,
                 max_columns: int, dtype: np.dtype | type = np.float32) -> None:
        self.layers, self.heads, self.head_dim, self.vocab = layers, heads, head_dim, vocab
        self.max_columns = max_columns
        self.dtype = np.dtype(dtype)
        self.rows = 0
        empty = np.zeros((0, heads, 0, head_dim), self.dtype)  # replaced, never written
        self.self_keys = [empty] * layers
        self.self_values = [empty] * layers
        self.cross_keys = [empty] * layers
        self.cross_values = [empty] * layers
        self.src_mask = np.zeros((0, 0), bool)
        self.cross_last = np.zeros((0, 1, layers * 2 * heads * head_dim), self.dtype)
        self.log_probs_buffer = np.zeros((0, vocab), np.float32)
        self.version = next(_versions)  # changes whenever a bound array would: rebind

    @property
    def capacity(self) -> int:
        return len(self.log_probs_buffer)

    @property
    def columns(self) -> int:
        return self.self_keys[0].shape[2]

    @property
    def src_width(self) -> int:
        return self.src_mask.shape[1]

    @property
    def log_probs(self) -> np.ndarray:
        return self.log_probs_buffer[: self.rows]

    # -- shape changes (each a copy of what is kept, and a rebind) -------------------------
    def reserve(self, rows: int, columns: int = 0, src_width: int = 0) -> None:
        """Make room for ``rows`` rows, ``columns`` self-cache columns and a source of
        ``src_width`` positions, keeping the first ``self.rows`` rows."""
        if rows <= self.capacity and columns <= self.columns and src_width <= self.src_width:
            return  # every step asks; almost always there is room
        capacity = self.capacity
        if rows > capacity:  # a first batch as it comes; growing running ones, double
            capacity = max(MIN_ROWS, rows, 2 * capacity if self.rows else 0)
        if columns > self.columns:
            columns = min(max(columns, MIN_COLUMNS, 2 * self.columns), self.max_columns)
        self._reallocate(capacity, max(columns, self.columns), max(src_width, self.src_width))

    def shrink(self, columns: int, src_width: int) -> None:
        """Give memory back when the buffers hold over four times what the rows need (a batch
        that once ran long or wide sentences, or many rows, keeps its buffers otherwise)."""
        rows = max(self.rows, MIN_ROWS)
        columns, src_width = max(columns, MIN_COLUMNS), max(src_width, MIN_COLUMNS)
        if (self.capacity > 4 * rows or self.columns > 4 * columns
                or self.src_width > 4 * src_width):
            self._reallocate(rows, columns, src_width)

    def _reallocate(self, capacity: int, columns: int, src_width: int) -> None:
        """Buffers of these sizes holding the first ``self.rows`` rows; only those whose shape
        changes are copied."""
        if (capacity, columns) != (self.capacity, self.columns):
            # Only columns before a row's position are read: nothing to zero.
            shape = (capacity, self.heads, columns, self.head_dim)
            self._resize_each(self.self_keys, shape, False)
            self._resize_each(self.self_values, shape, False)
            self.version = next(_versions)
        if (capacity, src_width) != (self.capacity, self.src_width):
            shape = (capacity, self.heads, src_width, self.head_dim)
            self._resize_each(self.cross_keys, shape)
            self._resize_each(self.cross_values, shape)
            self.src_mask = _grown(self.src_mask, self.rows, (capacity, src_width))
            self.version = next(_versions)
        if capacity != self.capacity:
            width = self.layers * 2 * self.heads * self.head_dim
            self.cross_last = self._resized(self.cross_last, (capacity, 1, width))
            self.log_probs_buffer = np.zeros((capacity, self.vocab), np.float32)
            self.version = next(_versions)

    def _resize_each(self, buffers: list, shape: tuple[int, ...], zeroed: bool = True) -> None:
        """Resize ``buffers`` in place, one at a time, so that each old buffer is freed before
        the next new one is allocated: building the new list first held every layer twice,
        the served peak under load (bench/memory.py)."""
        for layer, buffer in enumerate(buffers):
            buffers[layer] = None  # the list's reference gone, ``buffer`` the last one
            buffers[layer] = self._resized(buffer, shape, zeroed)
            del buffer

    def _resized(self, buffer: np.ndarray, shape: tuple[int, ...], zeroed: bool = True,
                 ) -> np.ndarray:
        return _grown(buffer, self.rows, shape, zeroed)

    def set_rows(self, rows: int) -> None:
        if rows > self.capacity:
            raise ValueError(f"{rows} rows, room for {self.capacity}: reserve first")
        if rows != self.rows:
            self.rows = rows
            self.version = next(_versions)

    def write_source(self, rows: np.ndarray, encoded: tuple[np.ndarray, ...],
                     picks: np.ndarray) -> None:
        """An encoder call's outputs (cross keys and values [layers, n, heads, src, head_dim],
        mask [n, src], cross_last [n, 1, layers * 2 * d_model]) into ``rows``: row ``rows[j]``
        gets the call's row ``picks[j]``, so beams repeat their sentence's.
        Columns past ``src`` are never read (the mask says where each source ends)."""
        keys, values, mask, last = encoded
        if not np.array_equal(picks, np.arange(len(mask))):
            keys, values, mask, last = keys[:, picks], values[:, picks], mask[picks], last[picks]
        # Consecutive rows (a new batch, or sentences appended to one) as a slice: a plain copy
        # where an index array makes numpy's slower scatter.
        target = rows
        if len(rows) and np.all(np.diff(rows) == 1):
            target = slice(int(rows[0]), int(rows[-1]) + 1)
        width = mask.shape[1]
        for layer in range(self.layers):
            self.cross_keys[layer][target, :, :width] = keys[layer]
            self.cross_values[layer][target, :, :width] = values[layer]
        self.src_mask[target, :width] = mask
        self.src_mask[target, width:] = False
        self.cross_last[target] = last

    def gather(self, order: np.ndarray, columns: int, cross: bool) -> None:
        """Rows ``order`` become rows 0 .. len(order) - 1 (beams taking their parents' history,
        or holes dropped): the first ``columns`` self-cache columns, and with ``cross`` the
        cross caches too (beams share their sentence's source, so they need not)."""
        count = len(order)
        # Only rows whose source differs are copied (most beams keep their own parent); the
        # right-hand side is gathered first, so rows that swap are safe.
        moved = np.flatnonzero(order != np.arange(count))
        sources = order[moved]
        if len(moved):
            for buffers in (self.self_keys, self.self_values):
                for buffer in buffers:
                    buffer[moved, :, :columns] = buffer[sources, :, :columns]
            if cross:
                for buffers in (self.cross_keys, self.cross_values):
                    for buffer in buffers:
                        buffer[moved] = buffer[sources]
                self.src_mask[moved] = self.src_mask[sources]
                self.cross_last[moved] = self.cross_last[sources]
        self.set_rows(count)

    # -- onnxruntime ----------------------------------------------------------------------
    def bind(self, binding: ort.IOBinding) -> None:
        """Bind every cache (input and output: the same buffer) and the log-probs output."""
        rows = self.rows
        for layer in range(self.layers):
            for name, buffers in (("self_keys", self.self_keys),
                                  ("self_values", self.self_values),
                                  ("cross_keys", self.cross_keys),
                                  ("cross_values", self.cross_values)):
                value = ort.OrtValue.ortvalue_from_numpy(buffers[layer][:rows])
                binding.bind_ortvalue_input(f"{name}_{layer}", value)
                # present_keys_i for self_keys_i, present_cross_keys_i for cross_keys_i
                output = "present_" + name.removeprefix("self_")
                binding.bind_ortvalue_output(f"{output}_{layer}", value)
        binding.bind_ortvalue_input(
            "cross_last", ort.OrtValue.ortvalue_from_numpy(self.cross_last[:rows]))
        self._bind_host(binding)

    def _bind_host(self, binding: ort.IOBinding) -> None:
        """The arrays that live in host memory whatever the device: the log-probs the search
        reads and the source mask (a byte a source position)."""
        binding.bind_ortvalue_output(
            "log_probs", ort.OrtValue.ortvalue_from_numpy(self.log_probs_buffer[: self.rows]))
        binding.bind_ortvalue_input(
            "src_mask", ort.OrtValue.ortvalue_from_numpy(self.src_mask[: self.rows]))
