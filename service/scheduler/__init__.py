"""Continuous batching: worker threads own the engines; requests only wait on futures.

Sentences from all requests wait in a bounded queue (one per language pair), requests taking
turns to place a sentence in a batch (``queue``). There is one worker thread per engine
replica (see ``Engine.replicas``); each has its own running batch per pair and loops over them
(``workers``), so that new sentences join between decoder steps and finished ones answer at
once. Admission is decided before a request costs anything, and a request stays admitted until
its last pass (``admission``). Faults stay where they happen: a failed step's sentences are
retried alone (``retries``), a dead worker is replaced or, dying too often, the scheduler gives
up (``supervision``). ``Scheduler`` is the front the service calls.
"""

from service.scheduler.admission import Admission, Admitted
from service.scheduler.errors import (
    DeadlineExceeded,
    QueueFull,
    RequestTooLarge,
    SchedulerError,
    SchedulerFailed,
    ShuttingDown,
    TranslationFailed,
    WorkerRestarted,
)
from service.scheduler.front import Scheduler
from service.scheduler.jobs import reserved_tokens
from service.scheduler.retries import QUARANTINE_SIZE, WORKER_FAILURE_LIMIT
from service.scheduler.supervision import RESTART_BACKOFF_S, RESTART_WINDOW_S, WORKER_RESTARTS

__all__ = [
    "QUARANTINE_SIZE",
    "RESTART_BACKOFF_S",
    "RESTART_WINDOW_S",
    "WORKER_FAILURE_LIMIT",
    "WORKER_RESTARTS",
    "Admission",
    "Admitted",
    "DeadlineExceeded",
    "QueueFull",
    "RequestTooLarge",
    "Scheduler",
    "SchedulerError",
    "SchedulerFailed",
    "ShuttingDown",
    "TranslationFailed",
    "WorkerRestarted",
    "reserved_tokens",
]
