"""Faults injected through the engine's interface, for the scheduler's and the API's tests.

``FaultyEngine`` wraps an engine (the real one or ``FakeEngine``) and hands out batches that
raise where a real engine could: a decoder step that fails while a chosen ("poison") sentence
is in the batch, the next few steps or every step for a while whatever their sentences, or the
batch's bookkeeping. The scheduler under test is not touched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any


class InjectedFault(RuntimeError):
    pass


class Faults:
    """What to break; shared by every replica's wrapper (workers run concurrently)."""

    def __init__(self, poison: Sequence[int] | None = None) -> None:
        self.poison = tuple(poison) if poison is not None else None
        self.poisons: set[tuple[int, ...]] = set()  # more poison sentences, each on its own
        self.broken_when: Path | None = None  # every step raises while this file exists
        self.broken_until = 0.0  # every step raises until this time.monotonic() (break_for)
        self.fail_steps = 0  # the next n steps raise, whatever is in the batch
        self.fail_removes = 0  # the next n removals raise (a bug outside the decoder)
        self.steps_failed = 0
        self._lock = threading.Lock()

    def break_for(self, seconds: float) -> None:
        """Every decoder step, whatever its sentences, raises for the next ``seconds``: a
        transient fault of the whole engine."""
        self.broken_until = time.monotonic() + seconds

    def take(self, name: str) -> bool:
        with self._lock:
            left = getattr(self, name)
            if left:
                setattr(self, name, left - 1)
            return bool(left)

    def count_failure(self) -> None:
        with self._lock:
            self.steps_failed += 1


class FaultyEngine:
    """``engine`` with batches that fail as ``faults`` says; everything else is the engine's."""

    def __init__(self, engine: Any, faults: Faults, *, replica: bool = False) -> None:
        self.engine = engine
        self.faults = faults
        if replica:
            self.replicas = [self]
        else:
            self.replicas = [
                self if r is engine else FaultyEngine(r, faults, replica=True)
                for r in getattr(engine, "replicas", [engine])
            ]

    def new_batch(self) -> FaultyBatch:
        return FaultyBatch(self.engine.new_batch(), self.faults)

    def __getattr__(self, name: str) -> Any:  # tokenize, bundle, options, ...
        return getattr(self.engine, name)


class FaultyBatch:
    def __init__(self, batch: Any, faults: Faults) -> None:
        self.batch = batch
        self.faults = faults
        self.sources: dict[Hashable, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    def add(self, key: Hashable, source_ids: list[int], options: Any) -> None:
        self.batch.add(key, source_ids, options)
        self.sources[key] = tuple(source_ids)

    def remove(self, key: Hashable) -> None:
        if self.faults.take("fail_removes"):
            raise InjectedFault("injected fault in the batch's bookkeeping")
        self.batch.remove(key)
        self.sources.pop(key, None)

    def clear(self) -> None:
        self.batch.clear()
        self.sources.clear()

    def step(self) -> list[tuple[Hashable, Any]]:
        sources = set(self.sources.values())
        poisoned = self.faults.poison in sources or bool(self.faults.poisons & sources)
        broken = ((self.faults.broken_when is not None and self.faults.broken_when.exists())
                  or time.monotonic() < self.faults.broken_until)
        if poisoned or broken or self.faults.take("fail_steps"):
            self.faults.count_failure()
            raise InjectedFault("injected decoder fault")
        finished = self.batch.step()
        for key, _ in finished:
            self.sources.pop(key, None)
        return finished
