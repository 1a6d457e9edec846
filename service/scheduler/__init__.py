"""Continuous batching: worker threads own the engines; requests only wait on futures.

Sentences from all requests wait in a bounded queue (one per language pair), requests taking
turns to place a sentence in a batch (``queue``). There is one worker thread per engine
replica (see ``Engine.replicas``); each has its own running batch per pair and loops over them
(``workers``), so that new sentences join between decoder steps and finished ones answer at
once. Admission is decided before a request costs anything, and a request stays admitted until
its last pass (``admission``). Faults stay where they happen: a failed step's sentences are
retried alone, a sentence failing alone while the canary translates is poison, and one failing
while the canary fails too waits in the queue while the worker backs off (``retries``); a dead
worker is replaced or, dying too often or its engine failing for good, the scheduler gives up
(``supervision``). ``Scheduler`` is the front the service calls.
"""

from service.scheduler.admission import Admission, Admitted
from service.scheduler.errors import (
    DeadlineExceeded,
    ModelLoadFailed,
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
from service.scheduler.retries import (
    POISON_FAILURES,
    QUARANTINE_S,
    QUARANTINE_SIZE,
    STEP_BACKOFF_MAX_S,
    STEP_BACKOFF_S,
)
from service.scheduler.supervision import RESTART_BACKOFF_S, RESTART_WINDOW_S, WORKER_RESTARTS

__all__ = [
    "POISON_FAILURES",
    "QUARANTINE_S",
    "QUARANTINE_SIZE",
    "RESTART_BACKOFF_S",
    "RESTART_WINDOW_S",
    "STEP_BACKOFF_MAX_S",
    "STEP_BACKOFF_S",
    "WORKER_RESTARTS",
    "Admission",
    "Admitted",
    "DeadlineExceeded",
    "ModelLoadFailed",
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
