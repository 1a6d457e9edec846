"""The scheduler's front: what the service calls, over the parts the package composes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from service.scheduler.admission import Admission, Admitted
from service.scheduler.errors import DeadlineExceeded
from service.scheduler.jobs import Request
from service.scheduler.lanes import Lane, Worker
from service.scheduler.state import replica_list
from service.scheduler.supervision import Supervision

if TYPE_CHECKING:
    from service.engine import Engine
    from service.search import DecodeOptions, Translation


class Scheduler(Supervision):
    """Continuous batching over engines (one per pair): requests queue sentences
    (``admitted``, ``translate``), worker threads decode them in running batches; ``drain`` and
    ``stop`` end it. Built as ``Scheduler(engines, max_batch_tokens=..., max_batch_rows=...,
    max_queue=..., max_request_sentences=..., batching=..., metrics=...,
    engine_failure_s=..., workers=...)``; ``add_pairs`` and ``remove_pairs`` change its pairs
    while it runs."""

    def start(self) -> None:
        for worker in self._workers:
            self._start(worker)

    def add_pairs(self, engines: Mapping[str, Engine]) -> None:
        """Pairs loaded while the scheduler runs (``service.residency``): a lane per worker,
        each on its own replica, and a queue. Raises ValueError for an engine whose replicas
        do not match the workers."""
        lanes: list[tuple[Worker, Lane]] = []
        metrics = {pair: self._metrics.pair(pair) for pair in engines} if self._metrics else {}
        for pair, engine in engines.items():
            replicas = replica_list(engine)
            if len(replicas) != len(self._workers):
                raise ValueError(f"{pair} has {len(replicas)} replicas for "
                                 f"{len(self._workers)} workers")
            lanes += [(worker, Lane(pair, replica, metrics.get(pair)))
                      for worker, replica in zip(self._workers, replicas, strict=True)]
        with self._lock:
            self._pair_metrics.update(metrics)
            for pair in engines:
                self._queues.setdefault(pair, OrderedDict())
                self._background.setdefault(pair, OrderedDict())
            for worker, lane in lanes:
                # A worker replaced meanwhile (supervision) gets the lanes too.
                self._workers[worker.index].add_lane(lane)

    def remove_pairs(self, pairs: Collection[str]) -> bool:
        """Pairs unloaded: their lanes and queues dropped, once nothing of theirs waits, runs
        or is being cancelled; False (and nothing dropped) while something does."""
        with self._lock:
            busy = any(self._queues.get(pair) or self._background.get(pair)
                       for pair in pairs) or any(
                lane.running for worker in self._workers for pair in pairs
                if (lane := worker.lanes.get(pair)) is not None) or any(
                request.pair in pairs for worker in self._workers for request in worker.cancelled)
            if busy:
                return False
            for pair in pairs:
                self._queues.pop(pair, None)
                self._background.pop(pair, None)
                self._pair_metrics.pop(pair, None)
                self._canary.pop(pair, None)
                self._quarantine.pop(pair, None)
                for worker in self._workers:
                    worker.remove_lane(pair)
            return True

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
        """Interactive sentences waiting (those ``max_queue`` bounds)."""
        return self._waiting - self._background_waiting

    @property
    def background_depth(self) -> int:
        """Background requests' sentences waiting (``admitted(background=True)``)."""
        return self._background_waiting

    @property
    def failed(self) -> bool:
        """Workers kept dying (past WORKER_RESTARTS), or an engine failed every step for
        ``engine_failure_s``: only a restart of the process helps."""
        return self._failed

    @property
    def accepting(self) -> bool:
        return self._accepting and not self._failed

    @contextlib.contextmanager
    def admitted(self, pair: str, sentences: int, request_id: str = "-",
                 background: bool = False) -> Iterator[Admitted]:
        """A request admitted for ``sentences`` (an estimate from the raw text, as ``admit``)
        and held so until the block ends, its last pass done: each pass is one
        ``Admitted.translate``. A ``background`` request (a document's) waits behind the
        interactive ones, in room of its own (``queue``). Raises what ``admit`` raises."""
        admission = self.admit(pair, sentences, background)
        try:
            yield Admitted(admission, request_id, self.translate, self.release_room)
        finally:
            self.release(admission)

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
            if admission is not None:  # a pass with nothing to queue is a pass all the same
                admission.submitted = True
                self.release_room(admission)
            return []
        loop = asyncio.get_running_loop()
        request = Request(
            pair=pair,
            sources=sources,
            options=options,
            loop=loop,
            future=loop.create_future(),
            results=[None] * len(sources),
            remaining=len(sources),
            id=request_id,
            background=admission is not None and admission.background,
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
