"""Dispatch across data-parallel servers (``generate.http.base_urls``): least-loaded first.

A server whose attempts fail several times in a row (connection errors, 5xx, timeouts) is
cooled down for a while, doubling each time it fails again, so one dead replica does not
eat every request's retries; when every server is cooling, the one back soonest is used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eyas.generate.http.errors import Cause

log = logging.getLogger(__name__)

SERVER_FAULTS = frozenset({Cause.CONNECTION, Cause.SERVER, Cause.TIMEOUT})


@dataclass
class Server:
    base_url: str
    in_flight: int = 0
    consecutive_failures: int = 0
    cool_until: float = 0.0

    @property
    def chat_url(self) -> str:
        return f"{self.base_url.rstrip('/')}/chat/completions"


class ServerPool:
    def __init__(
        self, base_urls: list[str], failures_to_cool: int = 3, cooldown_s: float = 5.0, max_cooldown_s: float = 120.0
    ):
        self.servers = [Server(u) for u in base_urls]
        self.failures_to_cool = failures_to_cool
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s

    def pick(self, now: float) -> Server:
        if len(self.servers) == 1:
            return self.servers[0]
        ready = [s for s in self.servers if s.cool_until <= now]
        if not ready:
            return min(self.servers, key=lambda s: s.cool_until)
        return min(ready, key=lambda s: s.in_flight)

    def succeeded(self, server: Server) -> None:
        server.consecutive_failures = 0

    def failed(self, server: Server, cause: Cause, now: float) -> None:
        if cause not in SERVER_FAULTS or len(self.servers) == 1:
            return
        server.consecutive_failures += 1
        excess = server.consecutive_failures - self.failures_to_cool
        if excess >= 0:
            pause = min(self.max_cooldown_s, self.cooldown_s * 2**excess)
            server.cool_until = now + pause
            log.warning(
                "%s failed %d times in a row; cooling it down for %.0f s",
                server.base_url,
                server.consecutive_failures,
                pause,
            )
