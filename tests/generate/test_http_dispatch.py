"""Requests in flight and where they go: the shrinking slot limit, server cool-down, open files."""

from __future__ import annotations

import asyncio
import resource

from eyas.generate.http import raise_open_files_limit
from eyas.generate.http.errors import Cause
from eyas.generate.http.servers import ServerPool
from eyas.generate.http.slots import Slots


def test_slots_shrink_on_in_flight_402_and_creep_back():
    async def scenario() -> None:
        slots = Slots(8)
        for _ in range(8):
            await slots.acquire()
        blocked = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        assert not blocked.done()
        slots.shrink()
        assert slots.limit == 6.0
        slots.shrink()  # a burst of 402s shrinks once, not once per response
        assert slots.limit == 6.0
        for _ in range(3):
            slots.release()
        await asyncio.sleep(0)
        assert blocked.done() and slots.used == 6
        for _ in range(30):
            slots.grow()
        assert slots.limit == 8.0

    asyncio.run(scenario())


def test_least_loaded_server_and_cool_down_after_repeated_faults():
    pool = ServerPool(["http://a/v1", "http://b/v1"], failures_to_cool=2, cooldown_s=10.0)
    a, b = pool.servers
    a.in_flight, b.in_flight = 3, 1
    assert pool.pick(0.0) is b
    pool.failed(b, Cause.PROMPT, 0.0)  # not the server's fault
    pool.failed(b, Cause.CONNECTION, 0.0)
    assert pool.pick(1.0) is b
    pool.failed(b, Cause.SERVER, 1.0)
    assert b.cool_until == 11.0 and pool.pick(2.0) is a
    pool.failed(b, Cause.TIMEOUT, 2.0)
    assert b.cool_until == 22.0
    a.cool_until = 30.0
    assert pool.pick(3.0) is b  # all cooling: the one back soonest
    pool.succeeded(b)
    assert b.consecutive_failures == 0 and pool.pick(40.0) is b
    assert b.chat_url == "http://b/v1/chat/completions"


def test_open_files_limit_is_raised_for_the_concurrency():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert raise_open_files_limit(100) == 256
        limit = raise_open_files_limit(1000)
        assert limit == min(1064, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
