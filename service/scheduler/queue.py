"""The fair queue: sentences from all requests wait, per language pair, in a bounded queue,
and requests take turns placing a sentence in a batch.

A worker takes waiting sentences while its batch has token and row budget left. The token
budget reserves a sentence's worst case up front, ``beam * (source + max target)``, so a batch
admitted under the budget can never outgrow it while it decodes: nothing has to be preempted,
and the batch's memory stays bounded. A sentence is always taken into an empty batch, so an
oversize one runs alone rather than never. Workers share the queue and balance it: a worker
leaves the next sentence to another worker whose batch has fewer rows and room for it.

Background requests (documents') wait in a queue of their own, behind the interactive ones:
a batch takes interactive sentences first, and background sentences with the room left. So
that documents still progress under any interactive load, background sentences take the
first turns up to ``BACKGROUND_SHARE`` of the batch's rows; beyond it they take only what
interactive sentences leave.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

from service.scheduler.admission import Admission, AdmissionControl
from service.scheduler.errors import QueueFull, RequestTooLarge, TranslationFailed
from service.scheduler.jobs import Job, Request, reserved_tokens
from service.scheduler.lanes import Lane, Worker

# The part of a batch's rows background sentences take before interactive ones, whenever both
# wait: documents progress at about this share of the throughput however busy the interactive
# traffic, and an interactive sentence waits behind at most this many background ones.
BACKGROUND_SHARE = 1 / 8


class FairQueue(AdmissionControl):
    """The waiting sentences, and the turns requests take in a worker's batch; sentences
    are queued (``_submit``) under the room their admission holds."""

    def _submit(self, request: Request, admission: Admission | None) -> None:
        queue = self._queue_of(request)
        background = request.background
        now = time.monotonic()
        with self._lock:
            held = 0
            later = admission is not None and admission.open and admission.submitted
            if admission is not None:
                held, admission.room = admission.room, 0
                self._hold(background, -held)
                admission.submitted = True
            self._check_open(accepted=later)
            quarantined = self._quarantine.get(request.pair)
            for index, source in enumerate(request.sources if quarantined else ()):
                until = quarantined.get(tuple(source))
                if until is None:
                    continue
                if until > now:
                    raise TranslationFailed(request.id, index)
                del quarantined[tuple(source)]  # served its time: tried again
            count = len(request.sources)
            if not later and count > self._max_request:
                raise RequestTooLarge(count, self._max_request)
            if (not later and count > held
                    and self._used(background) + count > self._max_queue):
                raise QueueFull(self._retry_after(background))
            beam = getattr(request.options, "beam_size", 1)
            for index, source in enumerate(request.sources):
                job = Job(request, index, reserved_tokens(len(source), request.options), beam, now)
                request.jobs.append(job)
            queue[request] = deque(request.jobs)
            self._waiting += count
            self._background_waiting += count if background else 0
            self._work.notify_all()
        self._set_queue_gauge()

    def _cancel(self, request: Request) -> None:
        with self._lock:
            if request.cancelled:
                return
            request.cancelled = True
            queues = self._background if request.background else self._queues
            dropped = len(queues.get(request.pair, {}).pop(request, ()))
            self._waiting -= dropped
            self._background_waiting -= dropped if request.background else 0
            for worker in self._workers:  # whichever runs its rows drops them
                worker.cancelled.append(request)
            self._work.notify_all()
        self._set_queue_gauge()

    def _admit(self, worker: Worker, lane: Lane) -> list[Job]:
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
        # Workers to leave a sentence to: fewer rows, or as many and a lower number; none
        # still proving itself or waiting out a fault of its engine (it takes no work).
        others = [
            (w.lanes[lane.pair], w.index < worker.index)
            for w in self._workers
            if w is not worker and w.proven and not w.step_backoff_s
        ]
        admitted: list[Job] = []
        interactive, background = self._queues[lane.pair], self._background[lane.pair]
        share = max(1, round(BACKGROUND_SHARE * self._max_rows))
        if background and lane.background_rows < share:  # documents' turn, up to their share
            self._take(worker, lane, background, others, admitted, share)
        self._take(worker, lane, interactive, others, admitted)
        if not interactive:  # what interactive sentences leave
            self._take(worker, lane, background, others, admitted)
        return admitted

    def _take(self, worker: Worker, lane: Lane, queue: OrderedDict[Request, deque[Job]],
              others: list[tuple[Lane, bool]], admitted: list[Job],
              background_rows: int | None = None) -> None:
        """``_admit``'s turns over one queue, interactive or background: sentences move into
        ``lane`` while they fit (and, with ``background_rows``, until the lane's background
        sentences hold that many rows)."""
        while queue and (background_rows is None or lane.background_rows < background_rows):
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
            if request.background:
                self._background_waiting -= 1
                lane.background_rows += job.rows
            admitted.append(job)

    def _fits(self, lane: Lane, job: Job) -> bool:
        # An empty batch takes any sentence, so an oversize one runs alone rather than never.
        if not lane.running:
            return True
        if not self._batching:
            return False
        over_tokens = lane.tokens + job.cost > self._max_tokens
        return not over_tokens and lane.rows + job.rows <= self._max_rows

    def _set_queue_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.set(self._waiting)
