"""Continuous batching: worker threads own the engines; requests only wait on futures.

Sentences from all requests wait in a bounded queue (one per language pair), requests taking
turns to place a sentence in a batch. There is one worker thread per engine replica (see
``Engine.replicas``); each has its own running batch per pair (a lane) and loops: take
cancellations, admit waiting sentences while its batch has token and row budget left (the
engine encodes them before its next step), run one decoder step for every lane with rows, and
hand each finished sentence to its request at once. A request's future resolves, via
``loop.call_soon_threadsafe``, the moment its last sentence finishes, whatever else is running.
Workers share the queue and balance it: a worker leaves the next sentence to another worker
whose batch has fewer rows and room for it.

The token budget reserves a sentence's worst case up front, ``beam * (source + max target)``,
so a batch admitted under the budget can never outgrow it while it decodes: nothing has to be
preempted, and the batch's memory stays bounded. A sentence is always admitted into an empty
batch, so an oversize one runs alone rather than never.

Engines are not thread-safe; only its own worker touches a replica and its batches. The lock
guards the queue and the cancellation lists, and is never held while an engine runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.decoding import DecodeOptions, Engine, Translation
    from service.metrics import Metrics, PairMetrics

log = logging.getLogger(__name__)


class SchedulerError(Exception):
    """Base of the scheduler's refusals."""


class QueueFull(SchedulerError):
    def __init__(self, retry_after: int) -> None:
        super().__init__(f"queue full; retry in {retry_after}s")
        self.retry_after = retry_after


class ShuttingDown(SchedulerError):
    def __init__(self) -> None:
        super().__init__("the service is shutting down")


class DeadlineExceeded(SchedulerError):
    def __init__(self) -> None:
        super().__init__("the request's deadline passed before its translation finished")


class SchedulerFailed(SchedulerError):
    def __init__(self) -> None:
        super().__init__("the scheduler thread has stopped after an internal error")


@dataclass(eq=False)
class _Request:
    pair: str
    sources: Sequence[Sequence[int]]
    options: DecodeOptions
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Translation]]
    results: list[Translation | None]
    remaining: int
    jobs: list[_Job] = field(default_factory=list)
    cancelled: bool = False  # deadline passed, client gone, or failed: drop its sentences


@dataclass(eq=False)  # hashed by identity: a job is its own key in the engine's batch
class _Job:
    request: _Request
    index: int
    cost: int
    rows: int
    enqueued_at: float
    in_batch: bool = False  # added to the engine's batch (its encoder ran)


class _Lane:
    """One worker's running batch of one language pair."""

    def __init__(self, pair: str, engine: Engine, metrics: PairMetrics | None) -> None:
        self.pair = pair
        self.engine = engine
        self.metrics = metrics
        self.batch = engine.new_batch()
        self.running: set[_Job] = set()
        self.tokens = 0
        self.rows = 0

    def release(self, job: _Job) -> None:
        if job in self.running:
            self.running.discard(job)
            self.tokens -= job.cost
            self.rows -= job.rows


class _Worker:
    """A thread with one engine replica per pair, and its lanes."""

    def __init__(
        self,
        index: int,
        engines: Mapping[str, Engine],
        metrics: Mapping[str, PairMetrics],
    ) -> None:
        self.index = index
        self.name = f"scheduler-{index}"
        self.lanes = {
            pair: _Lane(pair, engine, metrics.get(pair)) for pair, engine in engines.items()
        }
        self.cancelled: list[_Request] = []  # requests whose rows this worker must drop
        # Idle at its last look, it left the waiting sentences to a better-placed worker, so it
        # may sleep while they wait.
        self.deferred = False
        self.thread: threading.Thread | None = None

    @property
    def running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes.values())


class _Throughput:
    """Finished sentences per second, smoothed; only used to suggest Retry-After."""

    def __init__(self) -> None:
        self.rate = 0.0
        self._count = 0
        self._since = time.monotonic()
        self._lock = threading.Lock()  # workers add concurrently

    def add(self, finished: int) -> None:
        with self._lock:
            self._count += finished
            now = time.monotonic()
            elapsed = now - self._since
            if elapsed >= 1.0:
                current = self._count / elapsed
                self.rate = current if self.rate == 0 else 0.7 * self.rate + 0.3 * current
                self._count, self._since = 0, now


def reserved_tokens(source_length: int, options: DecodeOptions) -> int:
    """Worst-case tokens a sentence holds in the batch: every beam row, source plus target."""
    ratio_cap = int(getattr(options, "max_length_ratio", 2.0) * source_length) + 10
    target = min(getattr(options, "max_length", 256), ratio_cap)
    return getattr(options, "beam_size", 1) * (source_length + target)


class Scheduler:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        *,
        max_batch_tokens: int = 8192,
        max_batch_rows: int = 128,
        max_queue: int = 2048,
        batching: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        # One worker per replica (Engine.replicas); an engine without replicas is one.
        replicas = {pair: getattr(engine, "replicas", [engine]) for pair, engine in engines.items()}
        counts = {len(r) for r in replicas.values()}
        if len(counts) > 1:
            raise ValueError(f"every engine needs the same number of replicas, got {counts}")
        count = counts.pop() if counts else 1
        pair_metrics = {pair: metrics.pair(pair) for pair in engines} if metrics else {}
        self._workers = [
            _Worker(i, {pair: r[i] for pair, r in replicas.items()}, pair_metrics)
            for i in range(count)
        ]
        # Waiting sentences by request, in arrival order, per pair; admission takes one
        # sentence from each request in turn (see _admit).
        self._queues: dict[str, OrderedDict[_Request, deque[_Job]]] = {
            pair: OrderedDict() for pair in engines
        }
        self._max_tokens = max_batch_tokens
        self._max_rows = max_batch_rows
        self._max_queue = max_queue
        self._batching = batching
        self._metrics = metrics
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # workers wait here for sentences
        self._idle_cond = threading.Condition(self._lock)  # drain() waits here
        self._waiting = 0
        self._accepting = True
        self._stopping = False
        self._failed = False
        self._throughput = _Throughput()

    # -- event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        for worker in self._workers:
            worker.thread = threading.Thread(
                target=self._run, args=(worker,), name=worker.name, daemon=True
            )
            worker.thread.start()

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def queue_depth(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        """Sentences in running batches."""
        return sum(worker.running for worker in self._workers)

    @property
    def failed(self) -> bool:
        """A worker thread died of an internal error; only a restart helps."""
        return self._failed

    @property
    def accepting(self) -> bool:
        return self._accepting and not self._failed

    async def translate(
        self,
        pair: str,
        sources: Sequence[Sequence[int]],
        options: DecodeOptions,
        deadline: float | None = None,
    ) -> list[Translation]:
        """Translate tokenised sentences; ``deadline`` is in ``loop.time()`` terms.

        Raises QueueFull or ShuttingDown without accepting anything, DeadlineExceeded after
        dropping the request's sentences, or the engine's error for a sentence it refused.
        """
        if not sources:
            return []
        loop = asyncio.get_running_loop()
        request = _Request(
            pair=pair,
            sources=sources,
            options=options,
            loop=loop,
            future=loop.create_future(),
            results=[None] * len(sources),
            remaining=len(sources),
        )
        self._submit(request)
        try:
            async with asyncio.timeout_at(deadline):
                return await request.future
        except TimeoutError:
            raise DeadlineExceeded() from None
        finally:
            # Deadline, client disconnect (task cancelled): free the batch rows now.
            if not request.future.done() or request.future.cancelled():
                self._cancel(request)

    def _submit(self, request: _Request) -> None:
        queue = self._queues[request.pair]
        now = time.monotonic()
        with self._lock:
            if self._failed:
                raise SchedulerFailed()
            if not self._accepting:
                raise ShuttingDown()
            count = len(request.sources)
            # An empty queue takes any request, so one larger than MAX_QUEUE still runs.
            if self._waiting and self._waiting + count > self._max_queue:
                raise QueueFull(self._retry_after())
            beam = getattr(request.options, "beam_size", 1)
            for index, source in enumerate(request.sources):
                job = _Job(request, index, reserved_tokens(len(source), request.options), beam, now)
                request.jobs.append(job)
            queue[request] = deque(request.jobs)
            self._waiting += count
            self._work.notify_all()
        self._set_queue_gauge()

    def _retry_after(self) -> int:
        rate = self._throughput.rate
        if rate <= 0:
            return 1
        return max(1, min(60, math.ceil(self._waiting / rate)))

    def _cancel(self, request: _Request) -> None:
        with self._lock:
            if request.cancelled:
                return
            request.cancelled = True
            self._waiting -= len(self._queues[request.pair].pop(request, ()))
            for worker in self._workers:  # whichever runs its rows drops them
                worker.cancelled.append(request)
            self._work.notify_all()
        self._set_queue_gauge()

    def stop_accepting(self) -> None:
        with self._lock:
            self._accepting = False

    async def drain(self, grace_s: float) -> bool:
        """Stop admitting, let accepted work finish for up to ``grace_s``, stop the thread.

        Whatever is still unfinished after the grace period fails with ShuttingDown. Returns
        whether everything accepted finished.
        """
        self.stop_accepting()
        drained = await asyncio.to_thread(self.wait_idle, grace_s)
        await asyncio.to_thread(self.stop)
        return drained

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._lock:
            return self._idle_cond.wait_for(lambda: self._failed or self._idle(), timeout)

    def stop(self, timeout: float | None = None) -> None:
        with self._lock:
            self._stopping = True
            self._work.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in self._workers:
            if worker.thread is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                worker.thread.join(left)

    # -- worker threads --------------------------------------------------------------------

    def _idle(self) -> bool:
        cancelling = any(worker.cancelled for worker in self._workers)
        return not self._waiting and not cancelling and not self.in_flight

    def _run(self, worker: _Worker) -> None:
        error: BaseException | None = None
        try:
            while True:
                with self._lock:
                    while not (
                        self._stopping
                        or (self._waiting and not worker.deferred)
                        or worker.cancelled
                        or worker.running
                    ):
                        if self._idle():
                            self._idle_cond.notify_all()  # wake drain() waiters
                        self._work.wait()
                        worker.deferred = False  # something changed: look again
                    if self._stopping:
                        break
                    cancelled, worker.cancelled = worker.cancelled, []
                    worker.deferred = False
                    admitted = {lane: self._admit(worker, lane) for lane in worker.lanes.values()}
                    # Only an idle worker may sleep on a deferral: a busy one's rows may finish
                    # in the step below, and it must look again then. (The lowest-numbered idle
                    # worker never defers, so a waiting sentence always has a worker awake.)
                    worker.deferred = worker.deferred and not worker.running
                self._set_queue_gauge()
                for lane in worker.lanes.values():
                    self._drop(lane, cancelled)
                    self._encode(lane, admitted[lane])
                    self._step(lane)
                    if lane.metrics is not None:
                        running = sum(len(w.lanes[lane.pair].running) for w in self._workers)
                        lane.metrics.running_sentences.set(running)
        except BaseException as exc:  # a bug here must not leave requests hanging
            log.exception("%s failed", worker.name)
            error = exc
        finally:
            with self._lock:
                if error is not None:
                    self._failed = True
                self._stopping = True
                failed = self._failed
                leftovers = {job.request for lane in worker.lanes.values() for job in lane.running}
                for queue in self._queues.values():
                    leftovers |= set(queue)
                    queue.clear()
                self._waiting = 0
                self._work.notify_all()
                self._idle_cond.notify_all()
            for request in leftovers:
                self._settle(request, exception=SchedulerFailed() if failed else ShuttingDown())

    def _admit(self, worker: _Worker, lane: _Lane) -> list[_Job]:
        """Move waiting jobs into ``lane``'s running set while the budget allows (lock held).

        Requests take turns, one sentence each, in arrival order: a one-sentence request that
        arrives behind a thousand-sentence one joins at the next free slot instead of after
        all thousand. When the next sentence in turn does not fit, admission stops rather than
        skipping it, so a large sentence cannot be starved by a stream of small ones. A
        sentence is left for another worker whose batch of the pair has fewer rows and room
        for it (it takes it at its next step), so work spreads over the replicas; between
        batches of equal rows the lower-numbered worker takes it. So a lone client is always
        served by the same replica, whose weights and buffers are still in the caches: taking
        turns, as whichever worker woke first did, cost a 25-token sentence 49-51 ms a request
        where serving it from one replica took 37-45 (beam 2, int8, one client, sequential,
        the servers interleaved on the shared 2-core machine).
        """
        queue = self._queues[lane.pair]
        # Workers to leave a sentence to: fewer rows, or as many and a lower number.
        others = [
            (w.lanes[lane.pair], w.index < worker.index) for w in self._workers if w is not worker
        ]
        admitted: list[_Job] = []
        while queue:
            request, jobs = next(iter(queue.items()))
            job = jobs[0]
            if not self._fits(lane, job):
                if any(self._fits(o, job) for o, _ in others):
                    self._work.notify_all()  # one that has room may be asleep (deferred)
                break
            if any(
                (o.rows < lane.rows or (o.rows == lane.rows and first)) and self._fits(o, job)
                for o, first in others
            ):
                worker.deferred = True
                self._work.notify_all()  # that worker may be asleep (deferred) too
                break
            jobs.popleft()
            if jobs:
                queue.move_to_end(request)
            else:
                del queue[request]
            self._waiting -= 1
            lane.running.add(job)
            lane.tokens += job.cost
            lane.rows += job.rows
            admitted.append(job)
        return admitted

    def _fits(self, lane: _Lane, job: _Job) -> bool:
        # An empty batch takes any sentence, so an oversize one runs alone rather than never.
        if not lane.running:
            return True
        if not self._batching:
            return False
        over_tokens = lane.tokens + job.cost > self._max_tokens
        return not over_tokens and lane.rows + job.rows <= self._max_rows

    def _drop(self, lane: _Lane, cancelled: list[_Request]) -> None:
        for request in cancelled:
            for job in request.jobs:
                if job in lane.running:
                    if job.in_batch:
                        lane.batch.remove(job)
                    lane.release(job)
                    self._count(lane, "dropped")

    def _encode(self, lane: _Lane, jobs: list[_Job]) -> None:
        now = time.monotonic()
        for job in jobs:
            request = job.request
            if request.cancelled:  # failed earlier in this loop
                lane.release(job)
                continue
            source = request.sources[job.index]
            try:
                lane.batch.add(job, list(source), request.options)
                job.in_batch = True
            except Exception as exc:
                # The engine refused this sentence (e.g. too long): fail its request only.
                lane.release(job)
                self._count(lane, "failed")
                self._fail(lane, request, exc)
                continue
            if self._metrics is not None and lane.metrics is not None:
                self._metrics.queue_wait.observe(now - job.enqueued_at)
                lane.metrics.source_tokens.inc(len(source))

    def _step(self, lane: _Lane) -> None:
        if not lane.running:
            return
        rows = lane.batch.num_rows
        try:
            finished = lane.batch.step()
        except Exception as exc:
            # The batch's state is unknown after a failed step: fail its requests, start afresh.
            log.exception("decoder step failed for %s; failing %d sentences", lane.pair, rows)
            requests = {job.request for job in lane.running}
            lane.running.clear()
            lane.tokens = lane.rows = 0
            lane.batch = lane.engine.new_batch()
            for request in requests:
                self._fail(lane, request, exc)
            return
        if lane.metrics is not None:
            lane.metrics.decode_steps.inc()
            lane.metrics.batch_rows.observe(rows)
        for job, translation in finished:
            if job not in lane.running:
                continue
            lane.release(job)
            request = job.request
            if request.cancelled:
                continue
            self._count(lane, "done", translation)
            request.results[job.index] = translation
            request.remaining -= 1
            if request.remaining == 0:
                self._settle(request, result=request.results)
        self._throughput.add(len(finished))

    def _fail(self, lane: _Lane, request: _Request, exc: BaseException) -> None:
        self._cancel(request)  # other workers may run some of its sentences
        self._drop(lane, [request])
        self._settle(request, exception=exc)

    def _settle(
        self,
        request: _Request,
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

    def _count(self, lane: _Lane, outcome: str, translation: Translation | None = None) -> None:
        if lane.metrics is None:
            return
        lane.metrics.sentences[outcome].inc()
        if translation is not None:
            lane.metrics.generated_tokens.inc(len(translation.hypotheses[0].token_ids))

    def _set_queue_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.set(self._waiting)
