"""Supervision: a worker thread that dies fails the requests it was running and is replaced by
a new one, which proves itself on the canary (the shortest sentence translated) before it takes
work, after a backoff that doubles with each recent death; past ``WORKER_RESTARTS`` deaths in
``RESTART_WINDOW_S``, or once a worker's engine failed every step for ``engine_failure_s``
(``EngineBroken``), the scheduler gives up (``failed``), which is the service's cue to fail
its liveness check and exit.
"""

from __future__ import annotations

import logging
import threading
import time

from service.scheduler.errors import SchedulerError, SchedulerFailed, ShuttingDown, WorkerRestarted
from service.scheduler.lanes import Worker
from service.scheduler.retries import EngineBroken, Retries

log = logging.getLogger("service.scheduler")

# A worker that dies this many times within the window is not restarted again: the fault is
# not transient, and only a new process (the orchestrator's restart) may cure it.
WORKER_RESTARTS = 3
RESTART_WINDOW_S = 60.0
# A restarted worker waits this long, doubled with each death in RESTART_WINDOW_S: a fault
# that is not transient does not spin a new worker up every few milliseconds.
RESTART_BACKOFF_S = 0.1


class Supervision(Retries):
    """Worker threads started, proven, replaced when they die, and shut down."""

    def _start(self, worker: Worker) -> None:
        worker.thread = threading.Thread(
            target=self._run, args=(worker,), name=worker.name, daemon=True
        )
        worker.thread.start()

    def _run(self, worker: Worker) -> None:
        try:
            if not worker.proven:
                time.sleep(worker.backoff_s)
                self._prove(worker)
            self._loop(worker)
        except EngineBroken as exc:
            log.error("%s: %s; the engine is broken for good, giving up so that the process "
                      "is restarted", worker.name, exc)
            self._replace(worker, broken=True)
            return
        except BaseException:  # a bug or a broken replica must not leave requests hanging
            log.exception("%s failed", worker.name)
            self._replace(worker)
            return
        self._shut_down(worker)

    def _prove(self, worker: Worker) -> None:
        """A restarted worker decodes a sentence the service translated before, alone, before
        it takes work: a replica that cannot must not fail the requests it would admit."""
        for lane in list(worker.lanes.values()):
            canary = self._canary.get(lane.pair)
            if canary is None:
                continue
            source, options = canary
            batch = lane.engine.new_batch()
            batch.add("canary", list(source), options)
            while len(batch):
                batch.step()
        worker.proven = True

    def _replace(self, dead: Worker, broken: bool = False) -> None:
        """Fail the dead worker's requests and start a new worker in its place, unless workers
        died too often or its engine is ``broken`` for good (then fail everything: the
        scheduler is beyond repair)."""
        now = time.monotonic()
        with self._lock:
            requests = {job.request for lane in dead.lanes.values() for job in lane.running}
            self._deaths.append(now)
            while self._deaths and self._deaths[0] < now - RESTART_WINDOW_S:
                self._deaths.popleft()
            restart = (not self._stopping and not broken
                       and len(self._deaths) <= WORKER_RESTARTS)
            if restart:
                worker = Worker(dead.index, dead.engines, self._pair_metrics, proven=False)
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
            if self._failed and not broken:
                log.error("%s died %d times in %.0f s; giving up", dead.name, len(self._deaths),
                          RESTART_WINDOW_S)
            self._shut_down(dead)

    def _shut_down(self, worker: Worker) -> None:
        """The scheduler stops (or failed): whatever is left fails."""
        with self._lock:
            self._stopping = True
            failed = self._failed
            leftovers = {job.request for lane in worker.lanes.values() for job in lane.running}
            for queue in (*self._queues.values(), *self._background.values()):
                leftovers |= set(queue)
                queue.clear()
            self._waiting = self._background_waiting = 0
            self._work.notify_all()
            self._idle_cond.notify_all()
        for request in leftovers:
            self._settle(request, exception=SchedulerFailed() if failed else ShuttingDown())
