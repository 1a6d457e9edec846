"""Admission: whether a request may queue, decided before it costs anything.

``admit`` holds queue room for the sentence count estimated from the raw text, and the first
pass's ``translate`` turns that room into queued sentences once the text is split and
tokenised. A request over ``max_request_sentences`` (at most the queue) is refused outright, so
no one request can fill the queue and shut others out. An admitted request stays accepted
until it is released: its later passes (a glossary's masked sentences, a wider beam) are
queued whatever the queue holds and while draining, and draining waits for them.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.scheduler.errors import (
    QueueFull,
    RequestTooLarge,
    SchedulerFailed,
    ShuttingDown,
)
from service.scheduler.state import SchedulerState

if TYPE_CHECKING:
    from service.search import DecodeOptions, Translation


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
    background: bool = False  # a document's: room of its own, behind interactive requests


Submit = Callable[..., Awaitable[list["Translation"]]]


class Admitted:
    """A request held admitted by ``Scheduler.admitted`` until its last pass. Its first
    ``translate`` is the first pass: it takes the room the admission held and gives back what
    it did not take; the later ones are the passes of a request already accepted."""

    def __init__(self, admission: Admission, request_id: str, submit: Submit,
                 release_room: Callable[[Admission], None]) -> None:
        self.admission = admission
        self.request_id = request_id
        self._submit = submit
        self._release_room = release_room
        self._passed = False

    async def translate(self, sources: Sequence[Sequence[int]], options: DecodeOptions,
                        deadline: float | None = None) -> list[Translation]:
        """The translations of ``sources``, queued as one pass of this request."""
        first, self._passed = not self._passed, True
        try:
            return await self._submit(
                self.admission.pair, sources, options, deadline, admission=self.admission,
                request_id=self.request_id) if sources else []
        finally:
            if first:
                # The first pass is over even when it queued nothing (the sentence cache
                # answered it): the later ones are an accepted request's, never refused.
                self.admission.submitted = True
                self._release_room(self.admission)  # what the sentences did not take


class AdmissionControl(SchedulerState):
    """Queue room held for admitted requests, and the refusals when there is none."""

    def admit(self, pair: str, sentences: int, background: bool = False) -> Admission:
        """Hold queue room for ``sentences`` (an estimate from the raw text) before the text is
        split and tokenised; ``translate(admission=...)`` uses it, ``release`` gives it back.
        A ``background`` request's room is counted apart from the interactive ones', each up
        to ``max_queue``.

        Raises RequestTooLarge, QueueFull, ShuttingDown or SchedulerFailed.
        """
        with self._lock:
            self._check_open()
            if sentences > self._max_request:
                raise RequestTooLarge(sentences, self._max_request)
            if self._used(background) + sentences > self._max_queue:
                raise QueueFull(self._retry_after(background))
            self._hold(background, sentences)
            self._open += 1
        return Admission(pair, sentences, background=background)

    def _used(self, background: bool) -> int:
        """Queue room taken (waiting and held) by background requests, or interactive ones."""
        if background:
            return self._background_waiting + self._background_held
        return (self._waiting - self._background_waiting) + (self._held - self._background_held)

    def _hold(self, background: bool, sentences: int) -> None:
        self._held += sentences
        if background:
            self._background_held += sentences

    def check_room(self) -> None:
        """QueueFull when not one more interactive sentence fits: a request is then refused
        before its body is read, parsed and split, the cheapest refusal there is."""
        with self._lock:
            if self._used(False) >= self._max_queue:
                raise QueueFull(self._retry_after())

    def release_room(self, admission: Admission) -> None:
        """Give back what is left of an admission's room (nothing once ``translate`` ran);
        the request stays accepted."""
        with self._lock:
            self._hold(admission.background, -admission.room)
            admission.room = 0

    def release(self, admission: Admission) -> None:
        """The request is done: give back what is left of its room and its standing as
        accepted. Twice is harmless."""
        with self._lock:
            self._hold(admission.background, -admission.room)
            admission.room = 0
            if admission.open:
                admission.open = False
                self._open -= 1
                if self._idle():
                    self._idle_cond.notify_all()

    def _check_open(self, accepted: bool = False) -> None:
        """SchedulerFailed, or ShuttingDown once no new work is taken (``accepted`` work, an
        admitted request's later pass: once the workers stop)."""
        if self._failed:
            raise SchedulerFailed()
        if self._stopping if accepted else not self._accepting:
            raise ShuttingDown()

    def _retry_after(self, background: bool = False) -> int:
        rate = self._throughput.rate
        if rate <= 0:
            return 1
        # An interactive request waits behind interactive sentences alone.
        waiting = (self._background_waiting if background
                   else self._waiting - self._background_waiting)
        return max(1, min(60, math.ceil(waiting / rate)))
