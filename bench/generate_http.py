"""Bench: eyas's HTTP engine vs ``openai.AsyncOpenAI`` at 2,000 requests in flight.

A fake OpenAI server (``tests/generate/fake_openai.py``) runs in its own process and answers
every request after ``--latency`` seconds, so with R requests and C in flight the ideal wall
time is R / C × latency (20,000 / 2,000 × 5 s = 50 s). Each client runs in its own process
so CPU-seconds (user + system, from getrusage) and peak RSS are its own:

- eyas: the real ``eyas.generate.run`` on a 20,000-prompt dataset (prompts streamed in,
  records written, ledger journaled), ``generate.http.concurrency`` = 2,000, once on its default
  uvloop event loop and once on the standard asyncio loop;
- openai: what a user would write — ``AsyncOpenAI`` with an ``asyncio.Semaphore(2000)`` — on
  a smaller slice (its transport costs far more CPU per request).

Prints one table with both, per request. Run: ``.venv/bin/python bench/generate_http.py``
(``--requests 2000 --openai-requests 500 --latency 1`` for a quick look).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _usage() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_maxrss / 1024  # CPU seconds, peak RSS in MiB (Linux: KiB)


def client_eyas(base_url: str, requests: int, concurrency: int, event_loop: str = "uvloop") -> dict:
    from eyas import generate
    from eyas.config import parse_config

    work = Path(tempfile.mkdtemp(prefix="eyas-bench-"))
    with (work / "prompts.jsonl").open("w") as f:
        for i in range(requests):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"Explain item {i} of the benchmark in one sentence."}) + "\n")
    config = parse_config(
        {
            "run_dir": str(work / "run"),
            "datasets": [{"name": "bench", "source": str(work / "prompts.jsonl")}],
            "generate": {
                "backend": "openai",
                "max_tokens": 64,
                "http": {
                    "base_url": base_url,
                    "model": "fake/model",
                    "concurrency": concurrency,
                    "timeouts": {"read_s": 120.0},
                    "event_loop": event_loop,
                },
            },
        }
    )
    cpu0, _ = _usage()
    t0 = time.monotonic()
    generate.run(config, quiet=True)
    wall = time.monotonic() - t0
    cpu1, rss = _usage()
    records = [json.loads(line) for line in (work / "run" / "generate" / "bench.jsonl").open()]
    latencies = sorted(r["latency_s"] for r in records)
    return {
        "requests": requests,
        "done": len(records),
        "wall_s": wall,
        "cpu_s": cpu1 - cpu0,
        "rss_mb": rss,
        "p50_latency_s": latencies[len(latencies) // 2],
        "max_latency_s": latencies[-1],
        "retried": sum(r["attempts"] > 1 for r in records),
    }


def client_openai(base_url: str, requests: int, concurrency: int) -> dict:
    import openai

    async def main() -> int:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600.0)
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> int:
            async with gate:
                r = await client.chat.completions.create(
                    model="fake/model",
                    max_tokens=64,
                    messages=[{"role": "user", "content": f"Explain item {i} of the benchmark in one sentence."}],
                )
                return 1 if r.choices[0].message.content else 0

        results = await asyncio.gather(*(one(i) for i in range(requests)), return_exceptions=True)
        await client.close()
        return sum(1 for r in results if r == 1)

    cpu0, _ = _usage()
    t0 = time.monotonic()
    done = asyncio.run(main())
    wall = time.monotonic() - t0
    cpu1, rss = _usage()
    return {"requests": requests, "done": done, "wall_s": wall, "cpu_s": cpu1 - cpu0, "rss_mb": rss}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the fake server did not start")


def _run_client(name: str, base_url: str, requests: int, concurrency: int) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--client",
            name,
            "--base-url",
            base_url,
            "--requests",
            str(requests),
            "--concurrency",
            str(concurrency),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="eyas HTTP engine vs AsyncOpenAI")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--openai-requests", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=2_000)
    parser.add_argument("--latency", type=float, default=5.0)
    parser.add_argument("--client", choices=["eyas", "eyas-asyncio", "openai"], help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        if args.client == "openai":
            result = client_openai(args.base_url, args.requests, args.concurrency)
        else:
            result = client_eyas(
                args.base_url, args.requests, args.concurrency, "asyncio" if args.client == "eyas-asyncio" else "uvloop"
            )
        print(json.dumps(result))
        return

    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "generate" / "fake_openai.py"),
            "--port",
            str(port),
            "--latency",
            str(args.latency),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(port)
        base_url = f"http://127.0.0.1:{port}/v1"
        rows = {
            "eyas (aiohttp, uvloop)": _run_client("eyas", base_url, args.requests, args.concurrency),
            "eyas (aiohttp, asyncio loop)": _run_client("eyas-asyncio", base_url, args.requests, args.concurrency),
            "openai.AsyncOpenAI + semaphore": _run_client("openai", base_url, args.openai_requests, args.concurrency),
        }
    finally:
        server.terminate()
        server.wait()

    print(f"{args.concurrency} in flight, server answers after {args.latency:g} s\n")
    header = f"{'client':32} {'requests':>9} {'ok':>7} {'wall s':>8} {'ideal s':>8} {'wall/ideal':>10} {'CPU s':>8} {'CPU s/1k req':>12} {'peak RSS MB':>11}"
    print(header)
    print("-" * len(header))
    per_req = {}
    for name, r in rows.items():
        ideal = -(-r["requests"] // args.concurrency) * args.latency
        per_req[name] = r["cpu_s"] / r["requests"] * 1000
        print(
            f"{name:32} {r['requests']:>9,} {r['done']:>7,} {r['wall_s']:>8.1f} {ideal:>8.1f} {r['wall_s'] / ideal:>10.2f} "
            f"{r['cpu_s']:>8.1f} {per_req[name]:>12.3f} {r['rss_mb']:>11.0f}"
        )
    print(f"\nCPU s per 1,000 requests = ms per request. Server latency {args.latency:g} s.")
    openai_cpu = per_req["openai.AsyncOpenAI + semaphore"]
    for name, r in rows.items():
        if name.startswith("eyas"):
            print(
                f"{name}: request latency p50 {r['p50_latency_s']:.2f} s, max {r['max_latency_s']:.2f} s; "
                f"{r['retried']} retried; AsyncOpenAI spends {openai_cpu / per_req[name]:.1f}x its CPU per request"
            )


if __name__ == "__main__":
    main()
