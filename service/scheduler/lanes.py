"""What a worker thread holds: one engine replica per pair, and per pair a running batch (a
``Lane``) with the sentences in it and those being retried alone after a failed step."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from service.scheduler.jobs import Job, Request

if TYPE_CHECKING:
    from service.engine import Engine
    from service.metrics import PairMetrics


class Lane:
    """One worker's running batch of one language pair, and its sentences being retried."""

    def __init__(self, pair: str, engine: Engine, metrics: PairMetrics | None) -> None:
        self.pair = pair
        self.engine = engine
        self.metrics = metrics
        self.batch = engine.new_batch()
        self.running: set[Job] = set()  # in the batch, retrying, or in the solo batch
        self.tokens = 0
        self.rows = 0
        self.background_rows = 0  # the rows of background requests' sentences (``queue``)
        # After a failed step: its sentences, each to be decoded alone in ``solo``.
        self.retrying: deque[Job] = deque()
        self.solo: Any = None
        self.solo_job: Job | None = None

    @property
    def retries(self) -> int:
        return len(self.retrying) + (self.solo_job is not None)

    def release(self, job: Job) -> None:
        if job in self.running:
            self.running.discard(job)
            self.tokens -= job.cost
            self.rows -= job.rows
            if job.request.background:
                self.background_rows -= job.rows


class Worker:
    """A thread with one engine replica per pair, and its lanes."""

    def __init__(
        self,
        index: int,
        engines: Mapping[str, Engine],
        metrics: Mapping[str, PairMetrics],
        proven: bool = True,
    ) -> None:
        self.index = index
        self.name = f"scheduler-{index}"
        self.engines = dict(engines)  # its replica per pair; a pair may come and go (add_lane)
        self.lanes = {
            pair: Lane(pair, engine, metrics.get(pair)) for pair, engine in engines.items()
        }
        self.cancelled: list[Request] = []  # requests whose rows this worker must drop
        # Idle at its last look, it left the waiting sentences to a better-placed worker, so it
        # may sleep while they wait.
        self.deferred = False
        # Since when every step of this worker has failed, the canary's too (None while a
        # step succeeds), and how long it waits before its next step meanwhile: a transient
        # fault is retried with back-off, one that lasts ENGINE_FAILURE_S is for good.
        self.failing_since: float | None = None
        self.step_backoff_s = 0.0
        # False while a restarted worker proves itself on the canary: none leaves work to it.
        self.proven = proven
        self.backoff_s = 0.0  # how long a restarted worker waits before it proves itself
        self.thread: threading.Thread | None = None

    @property
    def running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes.values())

    def succeeded(self) -> None:
        """A step succeeded: whatever failed before was no engine fault, or has passed."""
        self.failing_since, self.step_backoff_s = None, 0.0

    def add_lane(self, lane: Lane) -> None:
        """A pair loaded while the worker runs (the scheduler's lock held)."""
        self.engines[lane.pair] = lane.engine
        self.lanes[lane.pair] = lane

    def remove_lane(self, pair: str) -> None:
        """A pair unloaded, its lane empty (the scheduler's lock held)."""
        self.engines.pop(pair, None)
        self.lanes.pop(pair, None)
