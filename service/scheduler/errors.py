"""The scheduler's refusals and failures, as a request sees them."""

from __future__ import annotations


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


class ModelLoadFailed(SchedulerError):
    """A pair's model could not be loaded on its first request (``service.residency``): a
    corrupt or unloadable bundle. A ``SchedulerError`` so that every path that answers the
    scheduler's refusals answers this one too; ``retry_after`` is when a load is tried again."""

    def __init__(self, pairs: list[str], bundle: str, cause: str, retry_after: int) -> None:
        super().__init__(f"the model of {', '.join(pairs)} ({bundle}) could not be loaded: "
                         f"{cause}")
        self.pairs = pairs
        self.bundle = bundle
        self.cause = cause
        self.retry_after = retry_after
