"""Live progress of an HTTP generation run, redrawn twice a second from the engine's counters.

Per dataset: completion tokens done / target, requests/s, tokens/s, in flight, failures
and ETA; one summary line with spend / budget, the projected cost to finish, and retries
by cause. Reading counters on a timer (instead of updating a bar per response) keeps the
display's cost independent of the request rate.
"""

from __future__ import annotations

import asyncio
import time

from rich.progress import BarColumn, Progress, TextColumn

from eyas.console import console
from eyas.generate.http.engine import DatasetRun, Engine


def _num(x: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.1f}{unit}"
    return f"{x:.0f}"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def remaining_tokens(ds: DatasetRun, max_tokens: int) -> float:
    """Completion tokens still to generate: up to the target, or for the prompts not yet done."""
    if ds.config.output_token_target is not None:
        return max(0.0, ds.config.output_token_target - ds.progress.completion_tokens)
    return max(0, ds.pending - ds.records - ds.failed) * ds.expected_tokens(max_tokens)


class LiveProgress:
    def __init__(self, engine: Engine, quiet: bool):
        self.engine = engine
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[line]}"),
            console=console,
            disable=quiet,
            transient=False,
        )
        self.tasks = {ds.name: self.bar.add_task(ds.name, total=None, line="") for ds in engine.datasets}
        self.summary = self.bar.add_task("spend", total=None, line="")

    async def run(self) -> None:
        with self.bar:
            try:
                while True:
                    self.refresh()
                    await asyncio.sleep(0.5)
            finally:
                self.refresh()

    def refresh(self) -> None:
        e = self.engine
        elapsed = max(time.monotonic() - e.started, 1e-9)
        run_tokens = sum(ds.tokens for ds in e.datasets)
        tok_rate = run_tokens / elapsed
        left_total = 0.0
        for ds in e.datasets:
            target = ds.config.output_token_target
            left = remaining_tokens(ds, e.g.max_tokens)
            left_total += left
            eta = left / (ds.tokens / elapsed) if ds.tokens else None
            line = (
                f"{_num(ds.progress.completion_tokens)}/{_num(target) if target else '-'} tok · "
                f"{ds.records / elapsed:.1f} req/s · {_num(ds.tokens / elapsed)} tok/s · {ds.in_flight} in flight · "
                f"{ds.failed} failed · ETA {_eta(eta)}"
            )
            self.bar.update(self.tasks[ds.name], completed=ds.progress.completion_tokens, total=target, line=line)
        ledger = e.ledger
        done_tokens = sum(ds.progress.completion_tokens for ds in e.datasets)
        projected = ledger.spent + (left_total * ledger.spent / done_tokens if done_tokens else 0.0)
        budget = f"${e.g.http.budget_usd:.2f}" if e.g.http.budget_usd else "no budget"
        retries = ", ".join(f"{k} {v}" for k, v in sorted(e.retries.items())) or "none"
        line = (
            f"${ledger.spent:.4f} / {budget} · projected ${projected:.2f} · {_num(tok_rate)} tok/s · "
            f"ETA {_eta(left_total / tok_rate if tok_rate else None)} · retries: {retries}"
        )
        self.bar.update(self.summary, line=line)
