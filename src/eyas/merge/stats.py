"""What the merged corpus holds: counts per split and dataset, and a length histogram.

``<run_dir>/merge/stats.json`` is also what ``eyas estimate`` reads, so the histogram's
bin edges include every power of two: the tokens a cap at 2^k would cut are then exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from rich.table import Table

# Powers of two and the halfway points between them, from 16 to 4M tokens.
BIN_EDGES = [0] + sorted({int(2**k * f) for k in range(4, 23) for f in (1.0, 1.5)})


@dataclass
class Histogram:
    """Samples and tokens per length bin ``[lo, hi)``."""

    samples: dict[int, int] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)

    def add(self, lengths: np.ndarray) -> None:
        if len(lengths) == 0:
            return
        bins = np.searchsorted(BIN_EDGES, lengths, side="right") - 1
        counts, sums = np.bincount(bins), np.bincount(bins, weights=lengths)
        for b in np.flatnonzero(counts):
            self.samples[int(b)] = self.samples.get(int(b), 0) + int(counts[b])
            self.tokens[int(b)] = self.tokens.get(int(b), 0) + int(sums[b])

    def to_json(self) -> list[dict]:
        return [
            {"lo": BIN_EDGES[b], "hi": _hi(b), "samples": self.samples[b], "tokens": self.tokens[b]}
            for b in sorted(self.samples)
        ]


def _hi(b: int) -> int | None:
    return BIN_EDGES[b + 1] if b + 1 < len(BIN_EDGES) else None


def tokens_over(histogram: list[dict], cap: int) -> float:
    """Tokens a cap at ``cap`` would cut from a histogram: exact when ``cap`` is a bin edge,
    else the straddling bin is taken as uniform."""
    cut = 0.0
    for row in histogram:
        lo, hi, n, t = row["lo"], row["hi"], row["samples"], row["tokens"]
        if lo >= cap:
            cut += t - n * cap
        elif hi is not None and lo < cap < hi and t > n * cap:
            above = n * (hi - cap) / (hi - lo)
            cut += min(t - n * cap, above * (hi - cap) / 2)
    return cut


@dataclass
class SplitStats:
    """One dataset's share of one split."""

    samples: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    truncated: int = 0
    histogram: Histogram = field(default_factory=Histogram)

    def add(self, lengths: np.ndarray, trainable: np.ndarray, truncated: np.ndarray) -> None:
        self.samples += len(lengths)
        self.tokens += int(lengths.sum())
        self.trainable_tokens += int(trainable.sum())
        self.truncated += int(truncated.sum())
        self.histogram.add(lengths)

    def to_json(self) -> dict:
        return {
            "samples": self.samples,
            "tokens": self.tokens,
            "trainable_tokens": self.trainable_tokens,
            "truncated": self.truncated,
            "length_histogram": self.histogram.to_json(),
        }


DROP_REASONS = ("no_trainable", "too_long", "token_budget", "weight")


def dropped_text(dropped: dict[str, int]) -> str:
    """``"3 no_trainable, 1 too_long"``, or ``"0"``."""
    return ", ".join(f"{n:,} {reason}" for reason, n in dropped.items() if n) or "0"


def summary_table(stats: dict) -> Table:
    """The printed form of ``stats.json``: one row per dataset, then the totals."""
    table = Table(title="merged corpus")
    columns = (
        "dataset",
        "train samples",
        "train tokens",
        "trainable",
        "eval samples",
        "eval tokens",
        "truncated",
        "dropped",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("dataset", "dropped") else "right")
    for name, entry in [*stats["datasets"].items(), ("[bold]all", stats)]:
        train, held_out = entry["train"], entry["eval"]
        table.add_row(
            name,
            f"{train['samples']:,}",
            f"{train['tokens']:,}",
            f"{train['trainable_tokens']:,}",
            f"{held_out['samples']:,}",
            f"{held_out['tokens']:,}",
            f"{train['truncated'] + held_out['truncated']:,}",
            dropped_text(entry["dropped"]),
        )
    return table


def histogram_table(histogram: list[dict], title: str) -> Table:
    table = Table(title=title)
    for column in ("length", "samples", "tokens"):
        table.add_column(column, justify="right")
    for row in histogram:
        hi = "" if row["hi"] is None else row["hi"] - 1
        table.add_row(f"{row['lo']}–{hi}", f"{row['samples']:,}", f"{row['tokens']:,}")
    return table
