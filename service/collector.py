"""Python's cyclic garbage collector in a long-running server.

A full pass of the collector holds the GIL while it walks every tracked object, and the
objects alive once the models are loaded (modules, sessions, tokenizers, settings: about
84,000) are most of them: 37-40 ms a pass (AMD EPYC), during which the event loop, and so
``/health``, waits. They live as long as the process, so they are frozen out of the passes
(``gc.freeze``) once the service is ready. Unloading a model is the exception: its engine sits
in reference cycles only the collector frees, so those objects are unfrozen and collected.
"""

from __future__ import annotations

import gc


def freeze_survivors() -> None:
    """What is garbage now collected, and every object still alive left out of later passes."""
    gc.collect()
    gc.freeze()


def collect_all() -> None:
    """Every object collected if garbage, frozen ones too (a model just unloaded), and the
    survivors frozen again."""
    gc.unfreeze()
    freeze_survivors()
