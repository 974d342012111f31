"""Stage 2 over HTTP: generate through any OpenAI-compatible API (OpenRouter, vLLM, SGLang, ...).

Consumes the configured prompt datasets; produces the same ``<dataset>.jsonl`` records as
the local backend (without ``token_ids``), ``<dataset>.errors.jsonl`` for requests that
used up their attempts, and the spending ledger ``generate/ledger.jsonl``.

Guarantees: one record per prompt, never two, across any number of interrupted runs (a
SIGKILL loses at most the requests in flight, whose reserved cost is then reported as
possibly spent); spend never passes ``generate.http.budget_usd``; an account out of credits or a
budget reached stops launching, saves what is in flight, and raises a ``RunStopped`` the
CLI turns into a distinct exit code, so rerunning the same command resumes.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eyas.config import ConfigError, RunConfig, resolve_api_key
from eyas.generate.http.budget import Ledger, Pricing
from eyas.generate.http.errlog import ErrorLog, compact
from eyas.generate.http.errors import RequestFailure, RunStopped
from eyas.generate.store import RecordWriter, scan
from eyas.generate.wanted import wanted
from eyas.paths import RunPaths
from eyas.stage import StageError

log = logging.getLogger(__name__)

FILES_PER_RUN = 64
"""Open files besides the sockets: records, error logs, the ledger, Python itself."""


def raise_open_files_limit(concurrency: int) -> int:
    """Lift the soft open-files limit to what ``concurrency`` sockets need; return the limit in force."""
    need = concurrency + FILES_PER_RUN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    log.info("raised the open-files limit from %d to %d for %d requests in flight", soft, new, concurrency)
    if new < need:
        log.warning("the hard open-files limit %d is below the %d that concurrency %d needs", hard, need, concurrency)
    return new


async def resolve_pricing(config: RunConfig, transport) -> Pricing | None:
    """Prices to budget with: `generate.http.prices`, else the endpoints listing; required with a budget."""
    from eyas.generate.http.providers import endpoints_url, parse_endpoints, provider_object, worst_case_pricing

    g = config.generate
    if g.http.prices is not None:
        return Pricing.per_million(g.http.prices.prompt, g.http.prices.completion)
    if g.http.budget_usd is None:
        return None
    url = endpoints_url(g.http.base_url or g.http.base_urls[0], g.http.model)
    try:
        pricing = worst_case_pricing(parse_endpoints(await transport.get_json(url)), provider_object(g))
    except (RequestFailure, ValueError) as e:
        raise ConfigError(
            f"generate.http.budget_usd is set but no prices are known: {url} gave no endpoints listing ({e}); "
            "set generate.http.prices"
        ) from None
    if pricing is None:
        raise ConfigError(
            f"generate.http.provider_policy: no endpoint of {g.http.model} passes the policy, nothing to budget with"
        )
    return pricing


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Refuse a second concurrent run on the same run_dir: it would buy the same prompts twice."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StageError(
                f"{lock.parent}: another eyas generate is running on this run_dir; let it finish or stop it"
            ) from None
        yield  # the lock goes with the file descriptor, also when the process is killed


def run_http(config: RunConfig, paths: RunPaths, quiet: bool = False) -> None:
    g = config.generate
    raise_open_files_limit(g.http.concurrency)
    api_key = resolve_api_key(g.http.api_key_env, g.http.api_key_file)
    with exclusive(paths.generate_lock), asyncio.Runner(loop_factory=event_loop_factory(g.http.event_loop)) as runner:
        runner.run(_run(config, paths, api_key, quiet))


def event_loop_factory(choice: str):
    """uvloop's loop when asked for and installed (not on Windows), else the standard one (None)."""
    if choice != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        log.info("uvloop is not installed; using the standard asyncio event loop")
        return None
    return uvloop.new_event_loop


async def _run(config: RunConfig, paths: RunPaths, api_key: str | None, quiet: bool) -> None:
    from eyas.generate.http.client import Transport
    from eyas.generate.http.engine import DatasetRun, Engine
    from eyas.generate.http.live import LiveProgress

    g = config.generate
    async with Transport(
        concurrency=g.http.concurrency,
        api_key=api_key,
        read_timeout_s=g.http.timeouts.read_s,
        request_timeout_s=g.http.timeouts.total_s,
    ) as transport:
        pricing = await resolve_pricing(config, transport)
        ledger = Ledger(paths.ledger, g.http.budget_usd)
        datasets: list[DatasetRun] = []
        try:
            for d in config.regenerated:
                progress = scan(paths.generations(d.name))
                pending = _count_pending(d, g.samples_per_prompt, progress.done)
                errors = ErrorLog(paths.generation_errors(d.name), progress.done)
                writer = RecordWriter(paths.generations(d.name), progress)
                datasets.append(DatasetRun(d, progress, writer, errors, pending))
                if errors.earlier:
                    log.info("%s: retrying %d prompts that failed in an earlier run", d.name, errors.earlier)
            engine = Engine(config, paths, transport, ledger, pricing, datasets)
            live = asyncio.create_task(LiveProgress(engine, quiet).run())
            try:
                await engine.run()
            finally:
                live.cancel()
                await asyncio.gather(live, return_exceptions=True)
        finally:
            for ds in datasets:
                ds.writer.close()
                ds.errors.close()
                compact(paths.generation_errors(ds.config.name), ds.progress.done)
            ledger.close()
    _report(engine, ledger)
    if engine.stop_reason is not None:
        raise engine.stop_reason


def _count_pending(dataset, samples_per_prompt: int, done: set[str]) -> int:
    """Answers left to make, for ETA and cost projection; quiet, since the feeding pass reports skipped rows."""
    prompts_log = logging.getLogger("eyas.prompts")
    level = prompts_log.level
    prompts_log.setLevel(logging.ERROR)
    try:
        return sum(1 for p in wanted(dataset, samples_per_prompt) if p.record_id not in done)
    finally:
        prompts_log.setLevel(level)


def _report(engine, ledger: Ledger) -> None:
    for ds in engine.datasets:
        log.info(
            "%s: %d records this run (%d in all), %d completion tokens in all, %d failed (see %s)",
            ds.name,
            ds.records,
            len(ds.progress.done),
            ds.progress.completion_tokens,
            ds.failed,
            engine.paths.generation_errors(ds.name).name,
        )
        if ds.truncated:
            log.warning(
                "%s: %d answers hit max_tokens (finish_reason length); kept and flagged, not re-bought",
                ds.name,
                ds.truncated,
            )
    budget = f" of ${ledger.budget_usd:.2f}" if ledger.budget_usd else ""
    extra = f" (+ ${ledger.possibly_spent:.4f} possibly spent by interrupted runs)" if ledger.possibly_spent else ""
    log.info("spent $%.4f%s%s", ledger.spent, budget, extra)


__all__ = ["RunStopped", "run_http"]
