"""The HTTP transport: one aiohttp session whose connector is sized to the concurrency.

aiohttp, not httpx or the openai SDK's default transport: at 2,000 requests in flight on two
cores, httpx spent ~245 CPU-seconds on 6,000 requests where aiohttp spent ~4 (measured
when this was designed; ``bench/generate_http.py`` compares against ``openai.AsyncOpenAI``).
Every way a request can fail is turned into a :class:`RequestFailure` with a classified
cause; the API key is sent as a header and scrubbed from any error text before it is kept.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from eyas.generate.http.errors import Cause, Failure, RequestFailure
from eyas.generate.http.response import Reply, StreamAssembler, parse_body
from eyas.generate.http.retry import classify_status


class Transport:
    """POSTs chat completions and GETs listings; use as ``async with Transport(...) as t``."""

    def __init__(
        self,
        *,
        concurrency: int,
        api_key: str | None,
        read_timeout_s: float,
        request_timeout_s: float | None = None,
    ):
        self._concurrency = concurrency
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=30.0, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Transport:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        # limit=concurrency: one pooled connection per request in flight, reused across requests.
        connector = aiohttp.TCPConnector(limit=self._concurrency, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, headers=headers, timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    async def chat(self, url: str, body: dict[str, Any], stream: bool) -> Reply:
        """One attempt at ``POST {url}``; raises RequestFailure on anything but a complete answer."""
        assert self._session is not None, "use Transport as an async context manager"
        try:
            async with self._session.post(url, data=json.dumps(body, ensure_ascii=False).encode()) as resp:
                if resp.status != 200:
                    raw = await resp.read()
                    raise RequestFailure(self._http_failure(resp.status, raw, resp.headers.get("Retry-After")))
                reply = await _read_stream(resp) if stream else parse_body(await resp.read())
                reply.generation_id = reply.generation_id or resp.headers.get("X-Generation-Id")
                return reply
        except RequestFailure as e:
            if self._api_key and self._api_key in e.failure.message:
                f = e.failure
                raise RequestFailure(Failure(f.cause, self._scrub(f.message), f.status, f.retry_after_s))
            raise
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise RequestFailure(Failure(Cause.TIMEOUT, f"timed out ({type(e).__name__})")) from None
        except (aiohttp.ClientError, ConnectionError, OSError) as e:
            raise RequestFailure(Failure(Cause.CONNECTION, self._scrub(f"{type(e).__name__}: {e}"))) from None

    def _http_failure(self, status: int, raw: bytes, retry_after: str | None) -> Failure:
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw[:200].decode("utf-8", "replace")
        f = classify_status(status, body, retry_after)
        return Failure(f.cause, self._scrub(f.message), f.status, f.retry_after_s)

    async def get_json(self, url: str) -> Any:
        """GET a JSON document (an endpoints listing); failures raise RequestFailure."""
        assert self._session is not None, "use Transport as an async context manager"
        try:
            async with self._session.get(url) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RequestFailure(self._http_failure(resp.status, raw, resp.headers.get("Retry-After")))
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as e:
            raise RequestFailure(
                Failure(Cause.CONNECTION, self._scrub(f"GET {url}: {type(e).__name__}: {e}"))
            ) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise RequestFailure(Failure(Cause.BAD_RESPONSE, f"GET {url}: malformed JSON")) from None


async def _read_stream(resp: aiohttp.ClientResponse) -> Reply:
    """Split the SSE body into lines ourselves: aiohttp's readline refuses lines over 512 KiB,
    and one chunk may carry a whole long answer or tool call."""
    assembler = StreamAssembler()
    pending = b""
    async for data in resp.content.iter_any():
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            assembler.feed_line(line)
            if assembler.done:
                return assembler.reply()
    assembler.feed_line(pending)
    return assembler.reply()
