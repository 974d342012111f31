"""Requests in flight: a limit that shrinks when OpenRouter says too much is in flight.

OpenRouter answers ``402 in_flight_budget_exhausted`` when the estimated cost of the
requests in flight does not fit a small prepaid balance. Waiting is not enough if the
same number is relaunched, so the limit drops by a quarter (at most once a second, since
one overload returns a burst of 402s) and creeps back by 0.1 per success.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)


class Slots:
    """A resizable semaphore with a single acquirer (the engine's feeder)."""

    def __init__(self, limit: int):
        self.max = limit
        self.limit = float(limit)
        self.used = 0
        self._freed = asyncio.Event()
        self._last_shrink = -1e9

    async def acquire(self) -> None:
        while self.used >= int(self.limit):
            self._freed.clear()
            await self._freed.wait()
        self.used += 1

    def release(self) -> None:
        self.used -= 1
        self._freed.set()

    def shrink(self) -> None:
        now = time.monotonic()
        if now - self._last_shrink < 1.0:
            return
        self._last_shrink = now
        self.limit = max(1.0, min(self.limit, self.used) * 0.75)
        log.warning(
            "too much in flight for the account (402 in_flight_budget_exhausted): limit now %d", int(self.limit)
        )

    def grow(self) -> None:
        if self.limit < self.max:
            self.limit = min(float(self.max), self.limit + 0.1)
