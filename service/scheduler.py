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

Admission is decided before a request costs anything: ``admit`` holds queue room for the
sentence count estimated from the raw text, and ``translate`` turns that room into queued
sentences once the text is split and tokenised. A request over ``max_request_sentences`` (at
most the queue) is refused outright, so no one request can fill the queue and shut others out.

Faults stay where they happen. A decoder step that raises fails none of its sentences at once:
the batch is cleared (it takes new sentences at once) and each of the sentences it held is
retried alone, one at a time in a batch of its own beside it; a sentence that fails alone
fails its request, and only that request. A worker
thread that dies fails the requests it was running and is replaced by a new one, which proves
itself on the last sentence the service translated before it takes work, after a backoff
that doubles with each recent death; past ``WORKER_RESTARTS`` deaths in ``RESTART_WINDOW_S``
the scheduler gives up (``failed``), which is the service's cue to fail its liveness check and
exit. A sentence that failed alone is quarantined: its copies are refused unrun. Several
different sentences failing alone in a row send the worker to the canary: if that translates,
they were poison and the worker goes on; if not, the worker is broken and replaced.

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
    from service.engine import Engine
    from service.metrics import Metrics, PairMetrics
    from service.search import DecodeOptions, Translation

log = logging.getLogger(__name__)

# A worker that dies this many times within the window is not restarted again: the fault is
# not transient, and only a new process (the orchestrator's restart) may cure it.
WORKER_RESTARTS = 3
RESTART_WINDOW_S = 60.0
# Different sentences failing even alone, in a row (no step succeeding between them), after
# which a worker decodes the canary, a sentence the service translated before: if that fails
# too the worker is broken and is restarted, if not the sentences were poison. Several poison
# sentences sent at once are bad inputs, not a broken worker: counting them as one killed the
# workers for good under four poison sentences four at a time.
WORKER_FAILURE_LIMIT = 4
# Sentences that failed alone, remembered per pair so that a copy of one is refused at once
# instead of failing a batch step and being retried alone again.
QUARANTINE_SIZE = 1024
# A restarted worker waits this long, doubled with each death in RESTART_WINDOW_S: a fault
# that is not transient does not spin a new worker up every few milliseconds.
RESTART_BACKOFF_S = 0.1


class SchedulerError(Exception):
    """Base of the scheduler's refusals."""


class QueueFull(SchedulerError):
    def __init__(self, retry_after: int) -> None:
        super().__init__(f"queue full; retry in {retry_after}s")
        self.retry_after = retry_after


class RequestTooLarge(SchedulerError):
    """More sentences than one request may queue: it could never be admitted whole."""

    def __init__(self, sentences: int, limit: int) -> None:
        super().__init__(f"{sentences} sentences; at most {limit} per request")
        self.sentences = sentences
        self.limit = limit


class ShuttingDown(SchedulerError):
    def __init__(self) -> None:
        super().__init__("the service is shutting down")


class DeadlineExceeded(SchedulerError):
    def __init__(self) -> None:
        super().__init__("the request's deadline passed before its translation finished")


class SchedulerFailed(SchedulerError):
    def __init__(self) -> None:
        super().__init__("the scheduler's workers keep failing; the service needs a restart")


class WorkerRestarted(SchedulerError):
    """The worker running some of the request's sentences died; a new one took its place."""

    def __init__(self) -> None:
        super().__init__("the worker translating this request failed and was restarted")


class TranslationFailed(SchedulerError):
    """A sentence failed a decoder step, and failed again when retried alone."""

    def __init__(self, request_id: str, index: int) -> None:
        super().__init__(f"sentence {index} of request {request_id} failed in the decoder")
        self.request_id = request_id
        self.index = index


@dataclass(eq=False)
class Admission:
    """Queue room held for a request while its text is split and tokenised (``admit``), and
    the request's standing as accepted until ``release``: its later passes (a glossary's
    masked sentences, a wider beam) are queued whatever the queue holds and while draining,
    and draining waits for them."""

    pair: str
    room: int
    open: bool = True
    submitted: bool = False


@dataclass(eq=False)
class _Request:
    pair: str
    sources: Sequence[Sequence[int]]
    options: DecodeOptions
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Translation]]
    results: list[Translation | None]
    remaining: int
    id: str = "-"
    jobs: list[_Job] = field(default_factory=list)
    cancelled: bool = False  # deadline passed, client gone, or failed: drop its sentences


@dataclass(eq=False)  # hashed by identity: a job is its own key in the engine's batch
class _Job:
    request: _Request
    index: int
    cost: int
    rows: int
    enqueued_at: float
    batch: Any = None  # the engine batch it was added to (its encoder runs there)
    retry: bool = False  # in its lane's ``retrying``, after a failed step

    @property
    def source(self) -> Sequence[int]:
        return self.request.sources[self.index]


class _Lane:
    """One worker's running batch of one language pair, and its sentences being retried."""

    def __init__(self, pair: str, engine: Engine, metrics: PairMetrics | None) -> None:
        self.pair = pair
        self.engine = engine
        self.metrics = metrics
        self.batch = engine.new_batch()
        self.running: set[_Job] = set()  # in the batch, retrying, or in the solo batch
        self.tokens = 0
        self.rows = 0
        # After a failed step: its sentences, each to be decoded alone in ``solo``.
        self.retrying: deque[_Job] = deque()
        self.solo: Any = None
        self.solo_job: _Job | None = None

    @property
    def retries(self) -> int:
        return len(self.retrying) + (self.solo_job is not None)

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
        proven: bool = True,
    ) -> None:
        self.index = index
        self.name = f"scheduler-{index}"
        self.engines = engines
        self.lanes = {
            pair: _Lane(pair, engine, metrics.get(pair)) for pair, engine in engines.items()
        }
        self.cancelled: list[_Request] = []  # requests whose rows this worker must drop
        # Idle at its last look, it left the waiting sentences to a better-placed worker, so it
        # may sleep while they wait.
        self.deferred = False
        # The sources that failed alone since the last step that succeeded.
        self.failed_sources: set[tuple[int, ...]] = set()
        # False while a restarted worker proves itself on the canary: none leaves work to it.
        self.proven = proven
        self.backoff_s = 0.0  # how long a restarted worker waits before it proves itself
        self.thread: threading.Thread | None = None

    @property
    def running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes.values())


class _WorkerBroken(Exception):
    """Raised in a worker whose steps keep failing, so that it is replaced."""


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
    return options.beam_size * (source_length + options.max_new_tokens(source_length))


class Scheduler:
    def __init__(
        self,
        engines: Mapping[str, Engine],
        *,
        max_batch_tokens: int = 8192,
        max_batch_rows: int = 128,
        max_queue: int = 2048,
        max_request_sentences: int | None = None,
        batching: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        # One worker per replica (Engine.replicas); an engine without replicas is one.
        replicas = {pair: getattr(engine, "replicas", [engine]) for pair, engine in engines.items()}
        counts = {len(r) for r in replicas.values()}
        if len(counts) > 1:
            raise ValueError(f"every engine needs the same number of replicas, got {counts}")
        count = counts.pop() if counts else 1
        self._pair_metrics = {pair: metrics.pair(pair) for pair in engines} if metrics else {}
        self._workers = [
            _Worker(i, {pair: r[i] for pair, r in replicas.items()}, self._pair_metrics)
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
        self._max_request = min(max_request_sentences or max_queue, max_queue)
        self._batching = batching
        self._metrics = metrics
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # workers wait here for sentences
        self._idle_cond = threading.Condition(self._lock)  # drain() waits here
        self._waiting = 0
        self._held = 0  # queue room held by admissions not yet turned into sentences
        self._open = 0  # admitted requests not yet released: draining waits for them
        self._accepting = True
        self._stopping = False
        self._failed = False
        self._deaths: deque[float] = deque()  # time.monotonic() of recent worker deaths
        # A sentence the service translated, per pair: a restarted worker decodes it first.
        self._canary: dict[str, tuple[Sequence[int], DecodeOptions]] = {}
        self._quarantine: dict[str, OrderedDict[tuple[int, ...], None]] = {}
        self._throughput = _Throughput()

    # -- event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        for worker in self._workers:
            self._start(worker)

    def _start(self, worker: _Worker) -> None:
        worker.thread = threading.Thread(
            target=self._run, args=(worker,), name=worker.name, daemon=True
        )
        worker.thread.start()

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def healthy_workers(self) -> int:
        """Workers alive and taking work (not dead, nor restarted and still proving itself)."""
        if self._failed:
            return 0
        return sum(
            w.proven and w.thread is not None and w.thread.is_alive() for w in self._workers
        )

    @property
    def max_request_sentences(self) -> int:
        return self._max_request

    @property
    def queue_depth(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        """Sentences in running batches."""
        return sum(worker.running for worker in self._workers)

    @property
    def failed(self) -> bool:
        """Workers kept dying (past WORKER_RESTARTS): only a restart of the process helps."""
        return self._failed

    @property
    def accepting(self) -> bool:
        return self._accepting and not self._failed

    def admit(self, pair: str, sentences: int) -> Admission:
        """Hold queue room for ``sentences`` (an estimate from the raw text) before the text is
        split and tokenised; ``translate(admission=...)`` uses it, ``release`` gives it back.

        Raises RequestTooLarge, QueueFull, ShuttingDown or SchedulerFailed.
        """
        with self._lock:
            self._check_open()
            if sentences > self._max_request:
                raise RequestTooLarge(sentences, self._max_request)
            if self._waiting + self._held + sentences > self._max_queue:
                raise QueueFull(self._retry_after())
            self._held += sentences
            self._open += 1
        return Admission(pair, sentences)

    def check_room(self) -> None:
        """QueueFull when not one more sentence fits: a request is then refused before its
        body is read, parsed and split, the cheapest refusal there is."""
        with self._lock:
            if self._waiting + self._held >= self._max_queue:
                raise QueueFull(self._retry_after())

    def release_room(self, admission: Admission) -> None:
        """Give back what is left of an admission's room (nothing once ``translate`` ran);
        the request stays accepted."""
        with self._lock:
            self._held -= admission.room
            admission.room = 0

    def release(self, admission: Admission) -> None:
        """The request is done: give back what is left of its room and its standing as
        accepted. Twice is harmless."""
        with self._lock:
            self._held -= admission.room
            admission.room = 0
            if admission.open:
                admission.open = False
                self._open -= 1
                if self._idle():
                    self._idle_cond.notify_all()

    async def translate(
        self,
        pair: str,
        sources: Sequence[Sequence[int]],
        options: DecodeOptions,
        deadline: float | None = None,
        *,
        admission: Admission | None = None,
        request_id: str = "-",
    ) -> list[Translation]:
        """Translate tokenised sentences; ``deadline`` is in ``loop.time()`` terms.

        With ``admission`` the sentences take the room it holds (more, if the estimate fell
        short and the queue has it); a second call with the same open admission is a later
        pass of an accepted request, queued even past ``max_queue`` and while draining:
        refusing it would lose the work accepted (it is bounded by the request's own
        sentences). Raises RequestTooLarge, QueueFull or ShuttingDown without accepting
        anything, DeadlineExceeded after dropping the request's sentences, TranslationFailed
        or WorkerRestarted after a fault, or the engine's error for a sentence it refused.
        """
        if admission is not None and admission.pair != pair:
            raise ValueError(f"an admission for {admission.pair} used for {pair}")
        if not sources:
            if admission is not None:
                self.release(admission)
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
            id=request_id,
        )
        self._submit(request, admission)
        try:
            async with asyncio.timeout_at(deadline):
                return await request.future
        except TimeoutError:
            raise DeadlineExceeded() from None
        finally:
            # Deadline, client disconnect (task cancelled): free the batch rows now.
            if not request.future.done() or request.future.cancelled():
                self._cancel(request)

    def _check_open(self, accepted: bool = False) -> None:
        """SchedulerFailed, or ShuttingDown once no new work is taken (``accepted`` work, an
        admitted request's later pass: once the workers stop)."""
        if self._failed:
            raise SchedulerFailed()
        if self._stopping if accepted else not self._accepting:
            raise ShuttingDown()

    def _submit(self, request: _Request, admission: Admission | None) -> None:
        queue = self._queues[request.pair]
        now = time.monotonic()
        with self._lock:
            held = 0
            later = admission is not None and admission.open and admission.submitted
            if admission is not None:
                held, admission.room = admission.room, 0
                self._held -= held
                admission.submitted = True
            self._check_open(accepted=later)
            quarantined = self._quarantine.get(request.pair, {})
            for index, source in enumerate(request.sources):
                if tuple(source) in quarantined:
                    raise TranslationFailed(request.id, index)
            count = len(request.sources)
            if not later and count > self._max_request:
                raise RequestTooLarge(count, self._max_request)
            if (not later and count > held
                    and self._waiting + self._held + count > self._max_queue):
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
        for worker in list(self._workers):
            thread = worker.thread
            if thread is not None and thread is not threading.current_thread():
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
        # A worker restarted while the others were joined.
        for worker in self._workers:
            thread = worker.thread
            if thread is not None and thread.is_alive():
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)

    # -- worker threads --------------------------------------------------------------------

    def _idle(self) -> bool:
        cancelling = any(worker.cancelled for worker in self._workers)
        return not self._waiting and not cancelling and not self.in_flight and not self._open

    def _run(self, worker: _Worker) -> None:
        try:
            if not worker.proven:
                time.sleep(worker.backoff_s)
                self._prove(worker)
            self._loop(worker)
        except BaseException:  # a bug or a broken replica must not leave requests hanging
            log.exception("%s failed", worker.name)
            self._replace(worker)
            return
        self._shut_down(worker)

    def _loop(self, worker: _Worker) -> None:
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
                    return
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
                self._step(worker, lane)
                if lane.retries:
                    self._retry_step(worker, lane)
                if lane.metrics is not None:
                    running = sum(len(w.lanes[lane.pair].running) for w in self._workers)
                    lane.metrics.running_sentences.set(running)

    def _prove(self, worker: _Worker) -> None:
        """A restarted worker decodes a sentence the service translated before, alone, before
        it takes work: a replica that cannot must not fail the requests it would admit."""
        for lane in worker.lanes.values():
            canary = self._canary.get(lane.pair)
            if canary is None:
                continue
            source, options = canary
            batch = lane.engine.new_batch()
            batch.add("canary", list(source), options)
            while len(batch):
                batch.step()
        worker.proven = True

    def _replace(self, dead: _Worker) -> None:
        """Fail the dead worker's requests and start a new worker in its place, unless workers
        died too often (then fail everything: the scheduler is beyond repair)."""
        now = time.monotonic()
        with self._lock:
            requests = {job.request for lane in dead.lanes.values() for job in lane.running}
            self._deaths.append(now)
            while self._deaths and self._deaths[0] < now - RESTART_WINDOW_S:
                self._deaths.popleft()
            restart = not self._stopping and len(self._deaths) <= WORKER_RESTARTS
            if restart:
                worker = _Worker(dead.index, dead.engines, self._pair_metrics, proven=False)
                worker.backoff_s = RESTART_BACKOFF_S * 2 ** (len(self._deaths) - 1)
                self._workers[dead.index] = worker
            elif not self._stopping:  # (while stopping, a death is no verdict)
                self._failed = True
        if self._metrics is not None:
            self._metrics.worker_failures.inc()
        for request in requests:
            self._cancel(request)
            if restart:
                error: SchedulerError = WorkerRestarted()
            else:
                error = SchedulerFailed() if self._failed else ShuttingDown()
            self._settle(request, exception=error)
        if restart:
            log.warning("restarting %s (%d deaths in %.0f s)", dead.name, len(self._deaths),
                        RESTART_WINDOW_S)
            self._start(worker)
        else:
            if self._failed:
                log.error("%s died %d times in %.0f s; giving up", dead.name, len(self._deaths),
                          RESTART_WINDOW_S)
            self._shut_down(dead)

    def _shut_down(self, worker: _Worker) -> None:
        """The scheduler stops (or failed): whatever is left fails."""
        with self._lock:
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
            (w.lanes[lane.pair], w.index < worker.index)
            for w in self._workers
            if w is not worker and w.proven
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
                    if job is lane.solo_job:
                        lane.solo_job = None
                    elif job.retry:
                        lane.retrying.remove(job)
                    if job.batch is not None:
                        job.batch.remove(job)
                    lane.release(job)
                    self._count(lane, "dropped")

    def _encode(self, lane: _Lane, jobs: list[_Job]) -> None:
        now = time.monotonic()
        for job in jobs:
            request = job.request
            if request.cancelled:  # failed earlier in this loop
                lane.release(job)
                continue
            source = job.source
            try:
                lane.batch.add(job, list(source), request.options)
                job.batch = lane.batch
            except Exception as exc:
                # The engine refused this sentence (e.g. too long): fail its request only.
                lane.release(job)
                self._count(lane, "failed")
                self._fail(lane, request, exc)
                continue
            if self._metrics is not None and lane.metrics is not None:
                self._metrics.queue_wait.observe(now - job.enqueued_at)
                lane.metrics.source_tokens.inc(len(source))

    def _step(self, worker: _Worker, lane: _Lane) -> None:
        if len(lane.running) <= lane.retries:  # the batch has no rows
            return
        rows = lane.batch.num_rows
        try:
            finished = lane.batch.step()
        except Exception as exc:
            self._step_failed(worker, lane, exc)
            return
        worker.failed_sources.clear()
        if lane.metrics is not None:
            lane.metrics.decode_steps.inc()
            lane.metrics.batch_rows.observe(rows)
        self._finish(lane, finished)

    def _step_failed(self, worker: _Worker, lane: _Lane, exc: Exception) -> None:
        """The batch's rows are in no known state after a failed step: clear it (its buffers
        stay), and retry each of its sentences alone, so that only one that fails again fails."""
        failed = lane.batch
        jobs = sorted(
            (job for job in lane.running if job.batch is failed), key=lambda j: j.enqueued_at
        )
        log.error(
            "decoder step failed on %s (%s: %s); retrying its %d sentences alone "
            "(requests %s)", lane.pair, type(exc).__name__, exc, len(jobs),
            ", ".join(sorted({job.request.id for job in jobs})),
        )
        failed.clear()
        for job in jobs:
            job.batch, job.retry = None, True
        lane.retrying.extend(jobs)
        if lane.metrics is not None:
            lane.metrics.step_failures.inc()
            lane.metrics.sentences["retried"].inc(len(jobs))

    def _retry_step(self, worker: _Worker, lane: _Lane) -> None:
        """One step of the sentence being retried alone (taking the next one if none is)."""
        if lane.solo_job is None:
            job = lane.retrying.popleft()
            job.retry = False
            lane.solo = lane.solo or lane.engine.new_batch()
            lane.solo.add(job, list(job.source), job.request.options)
            job.batch, lane.solo_job = lane.solo, job
        try:
            finished = lane.solo.step()
        except Exception as exc:
            job = lane.solo_job
            assert job is not None
            lane.solo.clear()
            lane.solo_job, job.batch = None, None
            log.error(
                "sentence %d of request %s failed again alone on %s (%s: %s); failing the "
                "request", job.index, job.request.id, lane.pair, type(exc).__name__, exc,
            )
            if lane.metrics is not None:
                lane.metrics.step_failures.inc()
            lane.release(job)
            self._count(lane, "failed")
            self._fail(lane, job.request, TranslationFailed(job.request.id, job.index))
            self._quarantined(lane.pair, tuple(job.source))
            worker.failed_sources.add(tuple(job.source))
            if len(worker.failed_sources) >= WORKER_FAILURE_LIMIT:
                failures = f"{len(worker.failed_sources)} different sentences failed alone"
                if lane.pair not in self._canary:  # nothing known good to tell poison by
                    raise _WorkerBroken(failures) from exc
                try:
                    self._prove(worker)
                except Exception as broken:
                    raise _WorkerBroken(f"{failures}, and so did the canary") from broken
                worker.failed_sources.clear()  # the worker is sound: those were poison
            return
        worker.failed_sources.clear()
        self._finish(lane, finished)

    def _quarantined(self, pair: str, source: tuple[int, ...]) -> None:
        """Remember a sentence that failed alone, so that its copies are refused unrun."""
        with self._lock:
            quarantine = self._quarantine.setdefault(pair, OrderedDict())
            quarantine[source] = None
            while len(quarantine) > QUARANTINE_SIZE:
                quarantine.popitem(last=False)

    def _finish(self, lane: _Lane, finished: list[tuple[Any, Translation]]) -> None:
        for job, translation in finished:
            if job not in lane.running:
                continue
            if job is lane.solo_job:
                lane.solo_job = None
            lane.release(job)
            request = job.request
            if request.cancelled:
                continue
            self._count(lane, "done", translation)
            request.results[job.index] = translation
            request.remaining -= 1
            if request.remaining == 0:
                self._settle(request, result=request.results)
        if finished:  # what a restarted worker proves itself on
            job = finished[-1][0]
            self._canary[lane.pair] = (job.source, job.request.options)
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
