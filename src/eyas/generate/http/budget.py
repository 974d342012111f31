"""The spending ledger: a hard dollar cap that survives crashes and restarts.

Before a request is launched its worst-case cost is *reserved* (estimated prompt tokens ×
prompt price + ``max_tokens`` × completion price, at the most expensive price the provider
policy allows); nothing is launched if spent + reserved would pass ``generate.http.budget_usd``.
When the answer arrives its real ``usage.cost`` replaces the reservation.

The ledger is a journal, ``<run_dir>/generate/ledger.jsonl``: one line per reserve, spend
and release, appended and flushed as it happens (a killed process loses nothing the OS
has). On open the journal is replayed; reservations never closed belong to requests that
were in flight at a crash. They may have been billed, so they are reported as *possibly
spent* and kept counting against the budget. The replayed state is then compacted into one
snapshot line (written to a temporary file, then renamed over the journal).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from eyas.files import write_text_atomic
from eyas.jsonl import DurableAppender, recover

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pricing:
    """USD per token; what the budget reserves with."""

    prompt: float
    completion: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return prompt_tokens * self.prompt + completion_tokens * self.completion

    @classmethod
    def per_million(cls, prompt: float, completion: float) -> Pricing:
        return cls(prompt / 1e6, completion / 1e6)


def estimate_prompt_tokens(messages: list[dict], tools: list | None = None) -> int:
    """A deliberately high estimate without the target's tokenizer: one token per 3 UTF-8 bytes.

    English averages ~4 bytes per token, so this over-reserves a little; reserving too
    little is what could break the cap.
    """
    size = sum(len(json.dumps(m, ensure_ascii=False).encode()) for m in messages)
    if tools:
        size += len(json.dumps(tools, ensure_ascii=False).encode())
    return size // 3 + 8 * len(messages)


@dataclass
class Spending:
    """What a ledger journal says was spent."""

    spent: float = 0.0
    possibly_spent: float = 0.0
    """Reservations of requests in flight when a run was killed: maybe billed, maybe not."""
    by_dataset: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_provider: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, usd: float, dataset: str, provider: str) -> None:
        self.spent += usd
        self.by_dataset[dataset] += usd
        self.by_provider[provider] += usd


def replay(path: Path) -> tuple[Spending, dict[str, float]]:
    """Read a journal without changing it: the spending, and the reservations never closed.

    Safe while a run appends to it (``eyas plan`` reads it so); a torn last line is ignored.
    """
    spending, open_ = Spending(), {}
    if not path.exists():
        return spending, open_
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue  # only the last line can be torn (appends are whole lines)
            kind = e.get("e")
            if kind == "snapshot":
                spending.spent, spending.possibly_spent = e["spent"], e["possibly_spent"]
                spending.by_dataset.update(e["by_dataset"])
                spending.by_provider.update(e["by_provider"])
            elif kind == "reserve":
                open_[e["id"]] = e["usd"]
            elif kind == "spend":
                open_.pop(e["id"], None)
                spending.add(e["usd"], e["dataset"], e["provider"])
            elif kind == "release":
                open_.pop(e["id"], None)
    return spending, open_


class Ledger:
    """Spend, reservations and crash leftovers, per dataset and per provider; one run owns it."""

    def __init__(self, path: Path, budget_usd: float | None):
        self.path = path
        self.budget_usd = budget_usd
        recover(path)
        self.spending, leftovers = replay(path)
        self.spending.possibly_spent += sum(leftovers.values())
        self.reserved: dict[str, float] = {}
        self.reserved_total = 0.0
        if leftovers:
            log.warning(
                "ledger: %d requests were in flight when an earlier run stopped; their reserved $%.4f "
                "is counted as possibly spent",
                len(leftovers),
                sum(leftovers.values()),
            )
        self._compact()
        self._journal = DurableAppender(path)

    @property
    def spent(self) -> float:
        return self.spending.spent

    @property
    def possibly_spent(self) -> float:
        return self.spending.possibly_spent

    def _compact(self) -> None:
        sp = self.spending
        snapshot = {
            "e": "snapshot",
            "spent": sp.spent,
            "possibly_spent": sp.possibly_spent,
            "by_dataset": dict(sp.by_dataset),
            "by_provider": dict(sp.by_provider),
        }
        write_text_atomic(self.path, json.dumps(snapshot) + "\n")

    @property
    def committed(self) -> float:
        """Money that is gone or may be: spent, possibly spent at a crash, and reserved in flight."""
        return self.spent + self.possibly_spent + self.reserved_total

    def fits(self, usd: float) -> bool:
        return self.budget_usd is None or self.committed + usd <= self.budget_usd + 1e-12

    # Zero amounts (servers that charge nothing) are kept in memory but not journaled: there is
    # no money to account for, and two lines per request cost measurable CPU at 2,000 in flight.

    def reserve(self, key: str, usd: float) -> bool:
        """Hold ``usd`` for request ``key``; False (and nothing held) when it would pass the budget."""
        if not self.fits(usd):
            return False
        self.reserved[key] = usd
        self.reserved_total += usd
        if usd:
            self._journal.write_json({"e": "reserve", "id": key, "usd": usd})
        return True

    def _unreserve(self, key: str) -> float:
        held = self.reserved.pop(key, 0.0)
        self.reserved_total -= held
        if not self.reserved:
            self.reserved_total = 0.0  # drop accumulated float error whenever nothing is in flight
        return held

    def spend(self, key: str, usd: float, dataset: str, provider: str) -> None:
        """The request's real cost arrived: it replaces the reservation."""
        held = self._unreserve(key)
        self.spending.add(usd, dataset, provider)
        if usd or held:
            self._journal.write_json({"e": "spend", "id": key, "usd": usd, "dataset": dataset, "provider": provider})

    def release(self, key: str) -> None:
        """The request ended without a bill (failed, or never sent)."""
        if self._unreserve(key):
            self._journal.write_json({"e": "release", "id": key})

    def close(self) -> None:
        self._journal.close()
