"""Retries: faults stay where they happen, and transient ones heal.

A decoder step that raises fails none of its sentences at once: the batch is cleared (it takes
new sentences at once) and each of the sentences it held is retried alone, one at a time in a
batch of its own beside it. A sentence that fails alone is judged by the canary, a sentence
the service translated before, decoded alone right after:

- the canary fails too: the engine is at fault, not the sentence. The sentences being retried
  go back to the front of the queue, none of them failed or quarantined, and the worker waits
  before its next step, 10 ms doubling to 1 s while the fault lasts. A fault that lasts
  ``engine_failure_s`` (ENGINE_FAILURE_S) is for good: the worker raises ``EngineBroken`` and
  the scheduler gives up (``supervision``), the service's cue to exit and be restarted.
- the canary translates: the engine works. The sentence is tried alone once more, and failing
  again it is poison: it fails its request, and only that request, and is quarantined (its
  copies refused unrun) for ``QUARANTINE_S``.
- no canary is known yet (nothing translated on the pair): the sentence's request fails, but
  nothing is quarantined on a verdict that could not be checked.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterable

from service.scheduler.errors import TranslationFailed
from service.scheduler.jobs import Job
from service.scheduler.lanes import Lane, Worker
from service.scheduler.workers import Workers

log = logging.getLogger("service.scheduler")

# Failures alone, with the canary translating after each, that make a sentence poison: one
# could be the last step of a fault that ended just before the canary ran.
POISON_FAILURES = 2
# Sentences that failed alone, remembered per pair so that a copy of one is refused at once
# instead of failing a batch step and being retried alone again; for QUARANTINE_S, so that a
# wrong verdict does not refuse a sentence for the life of the process.
QUARANTINE_SIZE = 1024
QUARANTINE_S = 600.0
# The wait before a worker's next step while every step fails, the canary's too: the first,
# doubled after each failure up to the most, back to none once a step succeeds.
STEP_BACKOFF_S = 0.01
STEP_BACKOFF_MAX_S = 1.0


class EngineBroken(Exception):
    """Raised in a worker whose engine failed every step, the canary's too, for
    ``engine_failure_s``: only a new process may cure it."""


class Retries(Workers):
    """A failed step's sentences decoded again alone, judged by the canary, and the
    quarantine."""

    def _step_failed(self, worker: Worker, lane: Lane, exc: Exception) -> None:
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

    def _retry_step(self, worker: Worker, lane: Lane) -> None:
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
            if lane.metrics is not None:
                lane.metrics.step_failures.inc()
            self._failed_alone(worker, lane, job, exc)
            return
        worker.succeeded()
        self._finish(lane, finished)

    def _failed_alone(self, worker: Worker, lane: Lane, job: Job, exc: Exception) -> None:
        """Judge a sentence that failed alone by the canary (see the module's docstring)."""
        canary = self._canary_translates(lane)
        if isinstance(canary, Exception):  # the engine fails, not the sentence
            self._requeue(lane, [job, *lane.retrying])
            self._engine_failing(worker, lane, canary)
            return
        if canary is True:
            worker.succeeded()
            job.alone_failures += 1
            if job.alone_failures < POISON_FAILURES:
                job.retry = True
                lane.retrying.appendleft(job)  # once more, alone, right away
                return
        log.error(
            "sentence %d of request %s failed again alone on %s (%s: %s)%s; failing the "
            "request", job.index, job.request.id, lane.pair, type(exc).__name__, exc,
            " while a sentence translated before translates" if canary else
            " (no sentence translated before to tell a bad sentence from a failing engine)",
        )
        lane.release(job)
        self._count(lane, "failed")
        self._fail(lane, job.request, TranslationFailed(job.request.id, job.index))
        if canary:
            self._quarantined(lane.pair, tuple(job.source))

    def _canary_translates(self, lane: Lane) -> bool | Exception | None:
        """True when the canary (the shortest sentence translated on the lane's pair)
        translates alone now (in the lane's solo batch), what it failed with if not, None
        when none is known."""
        canary = self._canary.get(lane.pair)
        if canary is None:
            return None
        source, options = canary
        lane.solo = lane.solo or lane.engine.new_batch()
        try:
            lane.solo.add("canary", list(source), options)
            while len(lane.solo):
                lane.solo.step()
        except Exception as exc:
            lane.solo.clear()
            return exc
        return True

    def _prove_while_failing(self, worker: Worker) -> None:
        """A worker backing off with nothing to run decodes the canary itself, so that it
        knows when the fault has passed (and whether it lasts ENGINE_FAILURE_S) without
        waiting for a request to try."""
        for lane in worker.lanes.values():
            canary = self._canary_translates(lane)
            if isinstance(canary, Exception):
                self._engine_failing(worker, lane, canary)
                return
        worker.succeeded()

    def _engine_failing(self, worker: Worker, lane: Lane, exc: Exception) -> None:
        """Every step fails, the canary's too: back off, or give up once it has lasted
        ``engine_failure_s``. The clock starts at the first failing canary since one
        translated, never at an older failure: a worker backing off keeps proving itself
        (``_prove_while_failing``) until one does."""
        now = time.monotonic()
        if worker.failing_since is None:
            worker.failing_since = now
        failing = now - worker.failing_since
        if failing >= self._engine_failure_s:
            raise EngineBroken(
                f"every decoder step on {lane.pair} failed for {failing:.1f} s, a sentence "
                f"translated before too ({type(exc).__name__}: {exc})"
            ) from exc
        worker.step_backoff_s = min(STEP_BACKOFF_MAX_S, 2 * worker.step_backoff_s
                                    or STEP_BACKOFF_S)
        log.warning(
            "%s: the engine fails every step on %s, a sentence translated before too (%s: "
            "%s), for %.2f s; its sentences wait in the queue, next try in %.2f s",
            worker.name, lane.pair, type(exc).__name__, exc, failing, worker.step_backoff_s,
        )

    def _requeue(self, lane: Lane, jobs: Iterable[Job]) -> None:
        """Put sentences being retried back at the front of the queue, each at the front of
        its request's turn, in their order: they are innocent as far as anyone can tell, and
        join a batch again (this worker's, or a healthy replica's) as new ones do."""
        with self._lock:
            for job in reversed(list(jobs)):
                lane.release(job)
                job.batch, job.retry = None, False
                request = job.request
                if request.cancelled:
                    self._count(lane, "dropped")
                    continue
                queue = self._queue_of(request)
                self._background_waiting += request.background
                waiting = queue.get(request)
                if waiting is None:
                    queue[request] = waiting = deque()
                    queue.move_to_end(request, last=False)
                waiting.appendleft(job)
                self._waiting += 1
            lane.retrying.clear()
            self._work.notify_all()
        self._set_queue_gauge()

    def _quarantined(self, pair: str, source: tuple[int, ...]) -> None:
        """Remember a sentence that failed alone, so that its copies are refused unrun."""
        with self._lock:
            quarantine = self._quarantine.setdefault(pair, OrderedDict())
            quarantine[source] = time.monotonic() + QUARANTINE_S
            quarantine.move_to_end(source)
            while len(quarantine) > QUARANTINE_SIZE:
                quarantine.popitem(last=False)
