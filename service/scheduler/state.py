"""The state the scheduler's parts share, under one lock.

The scheduler is one object built of parts, each a module and a class over this state, each
part on top of the one before: ``admission`` (queue room held for requests), ``queue`` (the
waiting sentences, requests taking turns), ``workers`` (their loop over running batches),
``retries`` (a failed step's sentences alone, the quarantine) and ``supervision`` (workers
started, proven, replaced or given up), under the ``Scheduler`` front. A worker's loop hands a
failed step to ``retries`` and ``retries`` a broken worker to ``supervision``. The parts share
the queue, the workers and the counts below, and one lock guards them all (never held while an
engine runs), so they are parts of one object rather than objects of their own.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from service.scheduler.jobs import Job, Request
from service.scheduler.lanes import Worker
from service.scheduler.throughput import Throughput

if TYPE_CHECKING:
    from service.engine import Engine
    from service.metrics import Metrics
    from service.search import DecodeOptions


def replica_list(engine: Engine) -> list[Engine]:
    return list(getattr(engine, "replicas", [engine]))


class SchedulerState:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        *,
        max_batch_tokens: int = 8192,
        max_batch_rows: int = 64,
        max_queue: int = 2048,
        max_request_sentences: int | None = None,
        batching: bool = True,
        metrics: Metrics | None = None,
        engine_failure_s: float = 30.0,
        workers: int | None = None,
    ) -> None:
        # One worker per replica (Engine.replicas); an engine without replicas is one.
        # ``workers`` says how many when pairs are loaded later (``Scheduler.add_pairs``).
        replicas = {pair: replica_list(engine) for pair, engine in engines.items()}
        counts = {len(r) for r in replicas.values()} | ({workers} if workers else set())
        if len(counts) > 1:
            raise ValueError(f"every engine needs the same number of replicas, got {counts}")
        count = counts.pop() if counts else 1
        self._pair_metrics = {pair: metrics.pair(pair) for pair in engines} if metrics else {}
        self._workers = [
            Worker(i, {pair: r[i] for pair, r in replicas.items()}, self._pair_metrics)
            for i in range(count)
        ]
        # Waiting sentences by request, in arrival order, per pair; admission takes one
        # sentence from each request in turn (see _admit).
        self._queues: dict[str, OrderedDict[Request, deque[Job]]] = {
            pair: OrderedDict() for pair in engines
        }
        # Background requests' (documents') sentences wait apart, likewise, behind these
        # (``queue``), with queue room of their own: they never take an interactive
        # request's room.
        self._background: dict[str, OrderedDict[Request, deque[Job]]] = {
            pair: OrderedDict() for pair in engines
        }
        self._max_tokens = max_batch_tokens
        self._max_rows = max_batch_rows
        self._max_queue = max_queue
        self._max_request = min(max_request_sentences or max_queue, max_queue)
        self._batching = batching
        self._metrics = metrics
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # workers wait here for sentences
        self._idle_cond = threading.Condition(self._lock)  # drain() waits here
        self._waiting = 0  # sentences waiting, background ones included
        self._held = 0  # queue room held by admissions not yet turned into sentences
        self._background_waiting = 0  # of ``_waiting``, background requests'
        self._background_held = 0  # of ``_held``, background requests'
        self._open = 0  # admitted requests not yet released: draining waits for them
        self._accepting = True
        self._stopping = False
        self._failed = False
        self._deaths: deque[float] = deque()  # time.monotonic() of recent worker deaths
        # The shortest sentence the service translated, per pair (the canary): a restarted
        # worker decodes it first, and a sentence failing alone is judged by it. Decoded
        # whole between two steps of the running batch, the last one translated (as long as
        # any) held the batch up for a second per wave of poison sentences.
        self._canary: dict[str, tuple[Sequence[int], DecodeOptions]] = {}
        # Sentences that failed alone while the canary translated, per pair, with the
        # ``time.monotonic()`` at which each is let through again.
        self._quarantine: dict[str, OrderedDict[tuple[int, ...], float]] = {}
        self._engine_failure_s = engine_failure_s
        self._throughput = Throughput()

    @property
    def in_flight(self) -> int:
        """Sentences in running batches."""
        return sum(worker.running for worker in self._workers)

    def _queue_of(self, request: Request) -> OrderedDict[Request, deque[Job]]:
        return (self._background if request.background else self._queues)[request.pair]

    def _idle(self) -> bool:
        cancelling = any(worker.cancelled for worker in self._workers)
        return not self._waiting and not cancelling and not self.in_flight and not self._open

    def _settle(
        self,
        request: Request,
        result: list[Any] | None = None,
        exception: BaseException | None = None,
    ) -> None:
        def settle() -> None:
            if request.future.done():  # the request gave up already
                return
            if exception is not None:
                request.future.set_exception(exception)
            else:
                request.future.set_result(result)

        # A closed loop means nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            request.loop.call_soon_threadsafe(settle)

