"""How late the event loop runs: the signal that the server takes requests in faster than it
can even parse them.

Admission (the scheduler's queue) refuses work the decoder cannot keep up with, but only once a
request has reached it; when requests arrive faster than the event loop can read, parse and
tokenise them, they wait in the loop's backlog instead, unanswered until their clients give up,
while the queue stays empty. ``LoopLag`` measures that wait, and the pipeline refuses new
requests with 503 and Retry-After while it is over MAX_LOOP_LAG_S, before any other work.
"""

from __future__ import annotations

import asyncio
import contextlib

# How often the loop is sampled: short enough to see a stall within a fraction of a second,
# long enough that the sampling itself costs nothing measurable (20 wake-ups a second).
INTERVAL_S = 0.05
# Each sample's weight. A loop that stays behind by L crosses L/2 within four samples (four
# seconds at L = 1 s); one stall counts a fifth of its length, so a stall shorter than five
# times MAX_LOOP_LAG_S (one client's huge text, say) turns nobody away.
SMOOTHING = 0.2


class LoopLag:
    """The event loop's lag: how much later than due a callback runs, smoothed over the last
    few samples."""

    def __init__(self) -> None:
        self.smoothed = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.smoothed = 0.0  # a loop that is gone is behind nothing

    @property
    def seconds(self) -> float:
        return self.smoothed

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + INTERVAL_S
            await asyncio.sleep(INTERVAL_S)
            late = max(0.0, loop.time() - due)
            self.smoothed += SMOOTHING * (late - self.smoothed)
