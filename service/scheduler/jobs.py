"""What the scheduler moves around: a request's tokenised sentences (``Request``), each a
``Job`` that waits in the queue and then holds rows and tokens in one worker's batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.search import DecodeOptions, Translation


@dataclass(eq=False)
class Request:
    pair: str
    sources: Sequence[Sequence[int]]
    options: DecodeOptions
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Translation]]
    results: list[Translation | None]
    remaining: int
    id: str = "-"
    jobs: list[Job] = field(default_factory=list)
    cancelled: bool = False  # deadline passed, client gone, or failed: drop its sentences
    background: bool = False  # a document's: waits behind interactive requests (``queue``)


@dataclass(eq=False)  # hashed by identity: a job is its own key in the engine's batch
class Job:
    request: Request
    index: int
    cost: int
    rows: int
    enqueued_at: float
    batch: Any = None  # the engine batch it was added to (its encoder runs there)
    retry: bool = False  # in its lane's ``retrying``, after a failed step
    alone_failures: int = 0  # steps failed alone while the canary translated

    @property
    def source(self) -> Sequence[int]:
        return self.request.sources[self.index]


def reserved_tokens(source_length: int, options: DecodeOptions) -> int:
    """Worst-case tokens a sentence holds in the batch: every beam row, source plus target."""
    return options.beam_size * (source_length + options.max_new_tokens(source_length))
