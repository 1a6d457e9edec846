"""The workers: one thread per engine replica, each with its own running batch per pair (a
lane), looping: take cancellations, take waiting sentences while its batch has token and row
budget left (the engine encodes them before its next step), run one decoder step for every
lane with rows, and hand each finished sentence to its request at once (after a back-off
while its engine fails every step, see ``retries``). A request's future resolves, via
``loop.call_soon_threadsafe``, the moment its last sentence finishes, whatever else is
running.

Engines are not thread-safe; only its own worker touches a replica and its batches. The lock
guards the queue and the cancellation lists, and is never held while an engine runs. A step
that raises goes to ``retries``; a worker that dies, to ``supervision``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from service.scheduler.jobs import Job, Request
from service.scheduler.lanes import Lane, Worker
from service.scheduler.queue import FairQueue

if TYPE_CHECKING:
    from service.search import Translation


class Workers(FairQueue):
    """The worker threads' loop over their lanes."""

    def _loop(self, worker: Worker) -> None:
        while True:
            if worker.step_backoff_s:  # every step fails, the canary's too: let it pass
                with self._lock:
                    self._work.wait_for(lambda: self._stopping, worker.step_backoff_s)
                if not worker.running and not self._stopping:
                    self._prove_while_failing(worker)
                    if worker.step_backoff_s:  # still failing: the queue waits out the back-off
                        with self._lock:
                            worker.cancelled = []  # none of their sentences runs here
                        continue
            with self._lock:
                while not (
                    self._stopping
                    or (self._waiting and not worker.deferred)
                    or worker.cancelled
                    or worker.running
                    or worker.step_backoff_s  # still failing: prove itself again
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
            # The lanes as they were under the lock: a pair may be loaded meanwhile.
            for lane in admitted:
                self._drop(lane, cancelled)
                self._encode(lane, admitted[lane])
                self._step(worker, lane)
                if lane.retries:
                    self._retry_step(worker, lane)
                if lane.metrics is not None:
                    running = sum(len(w.lanes[lane.pair].running) for w in self._workers
                                  if lane.pair in w.lanes)
                    lane.metrics.running_sentences.set(running)

    def _drop(self, lane: Lane, cancelled: list[Request]) -> None:
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

    def _encode(self, lane: Lane, jobs: list[Job]) -> None:
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

    def _step(self, worker: Worker, lane: Lane) -> None:
        if len(lane.running) <= lane.retries:  # the batch has no rows
            return
        rows = lane.batch.num_rows
        try:
            finished = lane.batch.step()
        except Exception as exc:
            self._step_failed(worker, lane, exc)
            return
        worker.succeeded()
        if lane.metrics is not None:
            lane.metrics.decode_steps.inc()
            lane.metrics.batch_rows.observe(rows)
        self._finish(lane, finished)

    def _finish(self, lane: Lane, finished: list[tuple[Any, Translation]]) -> None:
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
        if finished:  # the canary: the shortest sentence translated, the cheapest proof
            job = min((job for job, _ in finished), key=lambda job: len(job.source))
            known = self._canary.get(lane.pair)
            if known is None or len(job.source) <= len(known[0]):
                self._canary[lane.pair] = (job.source, job.request.options)
        self._throughput.add(len(finished))

    def _fail(self, lane: Lane, request: Request, exc: BaseException) -> None:
        self._cancel(request)  # other workers may run some of its sentences
        self._drop(lane, [request])
        self._settle(request, exception=exc)

    def _count(self, lane: Lane, outcome: str, translation: Translation | None = None) -> None:
        if lane.metrics is None:
            return
        lane.metrics.sentences[outcome].inc()
        if translation is not None:
            lane.metrics.generated_tokens.inc(len(translation.hypotheses[0].token_ids))
