"""The async runner: stream prompts in, keep ``concurrency`` requests in flight, stream records out.

One feeder coroutine walks the datasets' prompts and launches a task per prompt, after
taking a slot (:mod:`.slots`), checking the dataset's output-token target and reserving
the worst-case cost in the ledger (:mod:`.budget`). Every launched request ends in exactly
one *outcome* — a record, an error line, or "dropped" when the run stops — put on a queue
that one writer task owns: it writes the record (durable before it counts), settles the
ledger and updates the counters. Later turns of multi-turn conversations wait, parked, until
the turn before them is written.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from eyas.config import DatasetConfig, RunConfig
from eyas.generate.http.budget import Ledger, Pricing, estimate_prompt_tokens
from eyas.generate.http.client import Transport
from eyas.generate.http.errlog import ErrorLog
from eyas.generate.http.errors import (
    BudgetReached,
    Cause,
    CreditsExhausted,
    RequestFailure,
    RequestRejected,
    RunStopped,
)
from eyas.generate.http.providers import provider_object
from eyas.generate.http.response import Reply
from eyas.generate.http.retry import RetryPolicy
from eyas.generate.http.servers import ServerPool
from eyas.generate.http.slots import Slots
from eyas.generate.store import DatasetProgress, RecordWriter, conversation_for, make_record
from eyas.generate.wanted import wanted
from eyas.paths import RunPaths
from eyas.records import GenerationRecord, PromptRecord, Usage

log = logging.getLogger(__name__)


@dataclass
class DatasetRun:
    """One dataset's files and counters during a run."""

    config: DatasetConfig
    progress: DatasetProgress
    writer: RecordWriter
    errors: ErrorLog
    pending: int
    """Prompts not done at start (what is left if no target stops it earlier)."""
    in_flight: int = 0
    records: int = 0
    tokens: int = 0
    failed: int = 0
    truncated: int = 0
    parked: dict[str, PromptRecord] = field(default_factory=dict)
    """Later turns waiting for the turn before them, keyed by that turn's prompt id."""
    ready: deque[PromptRecord] = field(default_factory=deque)
    """Later turns whose previous turn is written: launched before new prompts."""

    @property
    def name(self) -> str:
        return self.config.name

    def expected_tokens(self, max_tokens: int) -> float:
        """Completion tokens one request is expected to produce: the mean so far, else max_tokens."""
        n = len(self.progress.done)
        return self.progress.completion_tokens / n if n else float(max_tokens)

    def target_reached(self, max_tokens: int) -> bool:
        target = self.config.output_token_target
        if target is None:
            return False
        return self.progress.completion_tokens + self.in_flight * self.expected_tokens(max_tokens) >= target


@dataclass
class Outcome:
    dataset: DatasetRun
    key: str
    record: GenerationRecord | None = None
    cost: float = 0.0
    error: dict[str, Any] | None = None
    abandoned: bool = False
    """Cancelled in flight: it may have been billed, so its reservation stays open in the ledger."""


def request_template(config: RunConfig) -> dict[str, Any]:
    """The fields every request shares; messages and tools are added per prompt."""
    g = config.generate
    body: dict[str, Any] = {
        "model": g.http.model,
        "max_tokens": g.max_tokens,
        "temperature": g.temperature,
        "top_p": g.top_p,
        "seed": g.seed,
    }
    if g.stop:
        body["stop"] = list(g.stop)
    if g.http.reasoning is not None:
        body["reasoning"] = g.http.reasoning.model_dump(exclude_none=True)
    provider = provider_object(g)
    if provider:
        body["provider"] = provider
    if g.http.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(g.http.extra_body)
    return body


class Engine:
    def __init__(
        self,
        config: RunConfig,
        paths: RunPaths,
        transport: Transport,
        ledger: Ledger,
        pricing: Pricing | None,
        datasets: list[DatasetRun],
        rng: random.Random | None = None,
    ):
        g = config.generate
        self.g = g
        self.paths = paths
        self.transport = transport
        self.ledger = ledger
        self.pricing = pricing
        self.datasets = datasets
        self.rng = rng or random.Random()
        self.policy = RetryPolicy(g.http.retry.max_attempts, g.http.retry.base_s, g.http.retry.max_s)
        self.pool = ServerPool(g.http.base_urls or [g.http.base_url])
        self.slots = Slots(g.http.concurrency)
        self.template = request_template(config)
        self.retries: Counter[str] = Counter()
        self.stop_reason: RunStopped | None = None
        self.started = time.monotonic()
        self._outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._crash: BaseException | None = None

    @property
    def in_flight(self) -> int:
        return sum(d.in_flight for d in self.datasets)

    def stop(self, reason: RunStopped) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            log.error("%s — finishing the %d requests in flight, launching no more", reason, self.in_flight)
        self._changed.set()

    async def run(self) -> None:
        writer = asyncio.create_task(self._write_outcomes())
        try:
            await self._feed()
            while self._tasks:
                await asyncio.wait(set(self._tasks))
            await self._outcomes.join()
        except asyncio.CancelledError:
            # Interrupted (Ctrl-C): abandon the requests in flight, but save every answer already received.
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            raise
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            while not self._outcomes.empty():
                self._settle(self._outcomes.get_nowait())
        if self._crash is not None:
            raise self._crash

    # -- launching ---------------------------------------------------------------------------

    async def _feed(self) -> None:
        """Launch round-robin over datasets until none has anything left to launch.

        A dataset whose target may be reached by what it has in flight is set aside, not
        waited on, so the others keep the slots busy until its answers tell whether it needs more.
        """
        prompts = {ds.name: wanted(ds.config, self.g.samples_per_prompt) for ds in self.datasets}
        open_ = list(self.datasets)
        while open_ and self.stop_reason is None:
            self._changed.clear()  # before feeding: an outcome arriving meanwhile must wake the wait below
            for ds in list(open_):
                if await self._feed_dataset(ds, prompts[ds.name]):
                    open_.remove(ds)
            if open_ and self.stop_reason is None:
                await self._changed.wait()

    async def _feed_dataset(self, ds: DatasetRun, prompts: Iterator[PromptRecord]) -> bool:
        """Launch what this dataset can launch now; True when it will never launch again."""
        while self.stop_reason is None:
            if ds.target_reached(self.g.max_tokens):
                if ds.in_flight:
                    return False
                log.info("%s: output_token_target %d reached", ds.name, ds.config.output_token_target)
                return True
            prompt = ds.ready.popleft() if ds.ready else next(prompts, None)
            if prompt is None:
                if ds.parked and ds.in_flight:
                    return False  # later turns wait for turns in flight
                if ds.parked:
                    log.warning(
                        "%s: %d later turns wait for earlier turns that failed; a rerun retries them",
                        ds.name,
                        len(ds.parked),
                    )
                return True
            if prompt.record_id in ds.progress.done:
                continue
            messages = conversation_for(prompt, ds.progress)
            if messages is None:
                ds.parked[_previous_turn(prompt.prompt_id)] = prompt
                continue
            if not await self._launch(ds, prompt, messages):
                return True
        return True

    async def _launch(self, ds: DatasetRun, prompt: PromptRecord, messages: list[dict]) -> bool:
        """Start one request; False when the run must stop launching."""
        await self.slots.acquire()
        key = prompt.record_id
        reserve = (
            self.pricing.cost(estimate_prompt_tokens(messages, prompt.tools), self.g.max_tokens)
            if self.pricing
            else 0.0
        )
        while not self.ledger.reserve(key, reserve):
            if self.stop_reason is None and not self.ledger.reserved:
                # Nothing in flight will hand money back: the budget is spent.
                self.stop(
                    BudgetReached(
                        f"budget reached: ${self.ledger.committed:.4f} spent or possibly spent of generate.http.budget_usd "
                        f"${self.g.http.budget_usd:.2f}, and the next request may cost up to ${reserve:.4f}; "
                        "raise generate.http.budget_usd and rerun to continue"
                    )
                )
            if self.stop_reason is not None:
                self.slots.release()
                return False
            self._changed.clear()
            await self._changed.wait()
        ds.in_flight += 1
        task = asyncio.create_task(self._request(ds, prompt, messages, key))
        self._tasks.add(task)
        task.add_done_callback(self._request_ended)
        if len(self._tasks) % 64 == 0:
            await asyncio.sleep(0)  # let responses in while a long run of free slots is being filled
        return True

    def _request_ended(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._crashed(task.exception())

    def _crashed(self, error: BaseException) -> None:
        """A bug or a local failure (disk full), not a server problem: stop launching, re-raise at the end."""
        if self._crash is None:
            self._crash = error
            self.stop(RunStopped(f"internal error: {error!r}"))

    # -- one request -------------------------------------------------------------------------

    async def _request(self, ds: DatasetRun, prompt: PromptRecord, messages: list[dict], key: str) -> None:
        body = {**self.template, "messages": messages}
        if prompt.sample:  # identical requests with one seed would get one answer from a seeded server
            body["seed"] = self.template["seed"] + prompt.sample
        if prompt.tools:
            body["tools"] = prompt.tools
        started = time.monotonic()
        attempt = 0
        outcome = Outcome(ds, key)
        try:
            while True:
                attempt += 1
                server = self.pool.pick(time.monotonic())
                server.in_flight += 1
                try:
                    reply = await self.transport.chat(server.chat_url, body, self.g.http.stream)
                except RequestFailure as e:
                    failure = e.failure
                    self.pool.failed(server, failure.cause, time.monotonic())
                    delay = self._on_failure(failure, attempt)
                    if delay is None:
                        if failure.cause not in (Cause.CREDITS, Cause.REJECTED):
                            outcome.error = _error_entry(prompt, failure, attempt)
                        return
                    self.retries[failure.cause.value] += 1
                    await asyncio.sleep(delay)
                    if self.stop_reason is not None and isinstance(
                        self.stop_reason, (CreditsExhausted, RequestRejected)
                    ):
                        return
                    continue
                finally:
                    server.in_flight -= 1
                self.pool.succeeded(server)
                self.slots.grow()
                outcome.record, outcome.cost = self._record(
                    prompt, messages, reply, server.base_url, time.monotonic() - started, attempt
                )
                return
        except asyncio.CancelledError:
            outcome.abandoned = True
            raise
        finally:
            self.slots.release()
            self._outcomes.put_nowait(outcome)

    def _on_failure(self, failure, attempt: int) -> float | None:
        if failure.cause is Cause.CREDITS:
            self.stop(
                CreditsExhausted(
                    f"the account has no credits left ({failure.message}); add credits and rerun the same command to resume"
                )
            )
            return None
        if failure.cause is Cause.REJECTED:
            self.stop(RequestRejected(f"the server rejects the requests ({failure.message}); fix the config and rerun"))
            return None
        if failure.cause is Cause.IN_FLIGHT_BUDGET:
            self.slots.shrink()
        return self.policy.next_delay(attempt, failure, self.rng.random())

    def _record(
        self, prompt: PromptRecord, messages: list[dict], reply: Reply, server: str, latency: float, attempts: int
    ) -> tuple[GenerationRecord, float]:
        usage: Usage = reply.usage
        if not reply.cost_reported and self.pricing is not None:
            usage.cost = self.pricing.cost(usage.prompt_tokens, usage.completion_tokens)
        record = make_record(
            prompt,
            messages,
            content=reply.content,
            finish_reason=reply.finish_reason,
            model=self.g.http.model,
            provider=reply.provider or server,
            usage=usage,
            reasoning=reply.reasoning,
            tool_calls=reply.tool_calls,
            generation_id=reply.generation_id,
            latency_s=round(latency, 3),
            attempts=attempts,
        )
        return record, usage.cost

    # -- the one writer ----------------------------------------------------------------------

    async def _write_outcomes(self) -> None:
        while True:
            outcome = await self._outcomes.get()
            try:
                self._settle(outcome)
            except Exception as e:  # keep draining, or run() would wait for these outcomes forever
                self._crashed(e)
            finally:
                self._outcomes.task_done()
                self._changed.set()

    def _settle(self, o: Outcome) -> None:
        ds = o.dataset
        ds.in_flight -= 1
        if o.record is not None:
            ds.writer.write(o.record)  # flushed: durable against a killed process before it counts
            later = ds.parked.pop(o.record.prompt_id, None)
            if later is not None:
                ds.ready.append(later)
            self.ledger.spend(o.key, o.cost, ds.name, o.record.provider)
            ds.records += 1
            ds.tokens += o.record.usage.completion_tokens
            ds.truncated += o.record.finish_reason == "length"
            return
        if o.abandoned:
            return
        self.ledger.release(o.key)
        if o.error is not None:
            ds.errors.write(o.error)
            ds.failed += 1


def _previous_turn(prompt_id: str) -> str:
    base, turn = prompt_id.rsplit("#", 1)
    return f"{base}#{int(turn) - 1}"


def _error_entry(prompt: PromptRecord, failure, attempts: int) -> dict[str, Any]:
    return {
        "id": prompt.record_id,
        "dataset": prompt.dataset,
        "prompt_id": prompt.prompt_id,
        "cause": failure.cause.value,
        "status": failure.status,
        "message": failure.message,
        "attempts": attempts,
        "time": time.time(),
    }
