"""A fake OpenAI/OpenRouter server (aiohttp) for tests and the bench: the one external service faked.

Failures are scripted per prompt by directives in the last user message, so every test
knows exactly what each prompt meets: ``[[429x2]]`` answers the first two attempts with
429 + Retry-After, then serves it. Directives: ``429 500 502 503 reset err200 toperr empty
malformed inflight midstream ctx always500`` (x N attempts, default 1), ``length``, and
``huge`` (a 600 kB answer, streamed as one chunk), ``noid`` (the generation id only in the
``X-Generation-Id`` header).
Server-wide: latency, prices, a credit balance after which every request gets a final 402,
an expected API key, SSE keep-alive comments. It counts what it served and charged, so tests
can check that nothing was bought twice.

Run standalone (the bench does): ``python tests/generate/fake_openai.py --port 8123 --latency 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

DIRECTIVE = re.compile(r"\[\[([a-z0-9]+?)(?:x(\d+))?\]\]")
PROMPT_PRICE = 1e-6  # USD per token
COMPLETION_PRICE = 4e-6


def endpoints_listing(model: str) -> dict:
    def ep(name, tag, quant, prompt, completion, p50):
        return {
            "name": f"{name} | {model}",
            "provider_name": name,
            "tag": tag,
            "quantization": quant,
            "context_length": 262144,
            "max_completion_tokens": 65536,
            "status": 0,
            "uptime_last_30m": 99.5,
            "throughput_last_30m": {"p50": p50, "p90": p50 * 1.5},
            "pricing": {"prompt": f"{prompt:.10f}", "completion": f"{completion:.10f}", "request": "0"},
        }

    return {
        "data": {
            "id": model,
            "name": model,
            "endpoints": [
                ep("FakeAI", "fakeai", "int4", 1e-6, 4e-6, 40.0),
                ep("Cheapo", "cheapo/fp4", "fp4", 0.3e-6, 1e-6, 90.0),
                ep("Precise", "precise", "fp8", 1.2e-6, 5e-6, 30.0),
                ep("Mystery", "mystery", "unknown", 0.5e-6, 2e-6, 60.0),
            ],
        }
    }


@dataclass
class FakeOpenAI:
    latency_s: float = 0.0
    retry_after: str = "0"
    credits_usd: float | None = None
    api_key: str | None = None
    keepalives: int = 2
    charged: float = 0.0
    served: Counter = field(default_factory=Counter)
    attempts: Counter = field(default_factory=Counter)
    bodies: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)
    """Monotonic arrival time of each request in `bodies`."""
    keep_bodies: bool = True
    hold_after: int | None = None
    """Answer this many requests, then hold every later one until :attr:`release` is set (so a
    test can interrupt a run that cannot have finished, however slow the machine)."""
    release: threading.Event = field(default_factory=threading.Event)
    received: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models/{author}/{slug}/endpoints", self.endpoints)
        return app

    async def endpoints(self, request: web.Request) -> web.Response:
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if model == "nobody/nothing":
            return web.json_response({"error": {"code": 404, "message": "model not found"}}, status=404)
        return web.json_response(endpoints_listing(model))

    @staticmethod
    def _error(status: int, message: str, headers: dict | None = None, **meta) -> web.Response:
        body = {"error": {"code": status, "message": message, "metadata": meta}}
        return web.json_response(body, status=status, headers=headers)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._error(401, "No auth credentials found (key rejected)")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(400, "request body is not JSON")
        if self.keep_bodies:
            self.bodies.append(body)
            self.arrivals.append(time.monotonic())
        prompt = body["messages"][-1]["content"]
        self.received += 1
        while self.hold_after is not None and self.received > self.hold_after and not self.release.is_set():
            await asyncio.sleep(0.02)
        self.attempts[prompt] += 1
        attempt = self.attempts[prompt]
        directives = {m.group(1): int(m.group(2) or 1) for m in DIRECTIVE.finditer(prompt)}
        failing = {d for d, n in directives.items() if attempt <= n}
        if self.latency_s and not body.get("stream"):
            await asyncio.sleep(self.latency_s)  # a stream spends its latency sending keep-alives instead
        if self.credits_usd is not None and self.charged >= self.credits_usd:
            return self._error(402, "Insufficient credits. Add more using https://openrouter.ai/credits")
        if "ctx" in directives:
            return self._error(
                400, "This endpoint's maximum context length is 10 tokens", error_type="context_length_exceeded"
            )
        if "always500" in directives:
            return self._error(500, "internal error")
        if "reset" in failing:
            request.transport.abort()
            return web.Response()
        if "429" in failing:
            return self._error(
                429, "rate limited upstream", {"Retry-After": self.retry_after}, error_type="rate_limit_exceeded"
            )
        if "inflight" in failing:
            return self._error(
                402, "in_flight_budget_exhausted: too many requests in flight", {"Retry-After": self.retry_after}
            )
        for status in ("500", "502", "503"):
            if status in failing:
                return self._error(int(status), "provider unavailable")
        if "empty" in failing:
            return web.Response(body=b"", content_type="application/json")
        if "malformed" in failing:
            return web.Response(body=b'{"choices": [{"message": ', content_type="application/json")
        if "err200" in failing:
            return web.json_response(
                {
                    "id": "gen-x",
                    "choices": [
                        {
                            "finish_reason": "error",
                            "error": {"code": 502, "message": "provider died"},
                            "message": {"content": "partial"},
                        }
                    ],
                }
            )
        if "toperr" in failing:
            return web.json_response({"error": {"code": 503, "message": "no provider available"}})
        content = f"answer to: {prompt}" + (" long" * 120_000 if "huge" in directives else "")
        finish = "length" if "length" in directives else "stop"
        prompt_tokens = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4 + 1
        completion_tokens = min(len(content.split()) + 3, body.get("max_tokens") or 10**9)
        cost = prompt_tokens * PROMPT_PRICE + completion_tokens * COMPLETION_PRICE
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": 3},
            "cost": cost,
        }
        gen_id = f"gen-{len(self.bodies)}-{attempt}"
        if body.get("stream"):
            return await self._stream(request, gen_id, content, finish, usage, "midstream" in failing, prompt, cost)
        self._charge(prompt, cost)
        answer = {
            "id": gen_id,
            "provider": "FakeAI",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "message": {"role": "assistant", "content": content, "reasoning": "let me think"},
                }
            ],
            "usage": usage,
        }
        if "noid" in directives:
            del answer["id"]
        return web.json_response(answer, headers={"X-Generation-Id": gen_id})

    def _charge(self, prompt: str, cost: float) -> None:
        self.served[prompt] += 1
        self.charged += cost

    async def _stream(self, request, gen_id, content, finish, usage, fail_midway, prompt, cost) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        def chunk(delta, finish_reason=None):
            return {
                "id": gen_id,
                "provider": "FakeAI",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        for _ in range(self.keepalives):
            await asyncio.sleep(self.latency_s / self.keepalives)
            await resp.write(b": OPENROUTER PROCESSING\n\n")
        if not self.keepalives:
            await asyncio.sleep(self.latency_s)
        await send(chunk({"role": "assistant", "reasoning": "let me "}))
        await send(chunk({"reasoning": "think"}))
        words = [content] if len(content) > 10_000 else content.split(" ")  # a huge answer arrives in one chunk
        for i, word in enumerate(words):
            await send(chunk({"content": word if i == 0 else " " + word}))
            if fail_midway and i == 1:
                await send(
                    {
                        "id": gen_id,
                        "error": {"code": 502, "message": "provider disconnected"},
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}],
                    }
                )
                await resp.write_eof()
                return resp
            if i == 0:
                await resp.write(b": OPENROUTER PROCESSING\n\n")
        await send(chunk({}, finish))
        await send({"id": gen_id, "provider": "FakeAI", "choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self._charge(prompt, cost)
        return resp


class FakeServer:
    """Serves a FakeOpenAI on 127.0.0.1 from a background thread; ``base_url`` ends in /v1."""

    def __init__(self, fake: FakeOpenAI, port: int = 0):
        self.fake = fake
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.fake.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def __enter__(self) -> FakeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    fake = FakeOpenAI(latency_s=args.latency, keep_bodies=False)
    web.run_app(fake.app(), host="127.0.0.1", port=args.port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
