"""Finished sentences per second, to tell a refused client when to retry."""

from __future__ import annotations

import threading
import time


class Throughput:
    """Finished sentences per second, smoothed; only used to suggest Retry-After."""

    def __init__(self) -> None:
        self.rate = 0.0
        self._count = 0
        self._since = time.monotonic()
        self._lock = threading.Lock()  # workers add concurrently

    def add(self, finished: int) -> None:
        with self._lock:
            self._count += finished
            now = time.monotonic()
            elapsed = now - self._since
            if elapsed >= 1.0:
                current = self._count / elapsed
                self.rate = current if self.rate == 0 else 0.7 * self.rate + 0.3 * current
                self._count, self._since = 0, now
