"""The C heap's settings for a long-running server (glibc's malloc; elsewhere nothing).

glibc serves a large allocation with its own mmap, returned to the system when freed, but
raises that threshold (up to 32 MiB) each time such a block is freed. After the first large
batch, the decoder's step tensors and the batch buffers (MiBs each) come from the heap
instead, where freed memory stays resident. A fixed threshold keeps them mmap'd and also
stops the heap from keeping more than the trim threshold free at its top.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("service")

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(kib: int) -> bool:
    """Serve allocations of ``kib`` KiB or more with mmap from now on, and trim the heap's
    free top beyond that; 0 leaves glibc's dynamic threshold. True when glibc took it."""
    if kib <= 0:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False  # not glibc (musl, macOS): its allocator's own policy stands
    size = kib * 1024
    taken = bool(mallopt(M_MMAP_THRESHOLD, size)) and bool(mallopt(M_TRIM_THRESHOLD, size))
    if not taken:
        log.warning("the C library refused MALLOC_MMAP_THRESHOLD_KB=%d", kib)
    return taken


def numpy_hugepages(enabled: bool) -> bool:
    """Whether numpy asks the kernel for transparent huge pages for its large arrays (its
    default where THP is in ``madvise`` mode). A batch's cache buffers have spare rows and
    columns never written; with huge pages each touched 2 MiB region becomes resident whole,
    without them only the 4 KiB pages written. Returns the previous setting."""
    try:
        from numpy._core import multiarray  # numpy 2
    except ImportError:
        from numpy.core import multiarray  # numpy 1
    return bool(multiarray._set_madvise_hugepage(enabled))
