"""Retries: faults stay where they happen.

A decoder step that raises fails none of its sentences at once: the batch is cleared (it takes
new sentences at once) and each of the sentences it held is retried alone, one at a time in a
batch of its own beside it; a sentence that fails alone fails its request, and only that
request. A sentence that failed alone is quarantined: its copies are refused unrun. Several
different sentences failing alone in a row send the worker to the canary (``supervision``): if
that translates, they were poison and the worker goes on; if not, the worker is broken and
replaced.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from service.scheduler.errors import TranslationFailed
from service.scheduler.lanes import Lane, Worker
from service.scheduler.workers import Workers

log = logging.getLogger("service.scheduler")

# Different sentences failing even alone, in a row (no step succeeding between them), after
# which a worker decodes the canary, a sentence the service translated before: if that fails
# too the worker is broken and is restarted, if not the sentences were poison. Several poison
# sentences sent at once are bad inputs, not a broken worker: counting them as one killed the
# workers for good under four poison sentences four at a time.
WORKER_FAILURE_LIMIT = 4
# Sentences that failed alone, remembered per pair so that a copy of one is refused at once
# instead of failing a batch step and being retried alone again.
QUARANTINE_SIZE = 1024


class WorkerBroken(Exception):
    """Raised in a worker whose steps keep failing, so that it is replaced."""


class Retries(Workers):
    """A failed step's sentences decoded again alone, and the quarantine."""

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
                    raise WorkerBroken(failures) from exc
                try:
                    self._prove(worker)
                except Exception as broken:
                    raise WorkerBroken(f"{failures}, and so did the canary") from broken
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
