"""What ``eyas tune`` measures next, and what its measurements say: pure functions, no servers.

A *cell* is one way to serve: plain decoding, one of llama.cpp's n-gram methods, or the drafter
in a GGUF type at a draft length and ``--spec-draft-p-min``; each at a thread count and a number
of requests in flight. Its samples are speed ratios: tokens per second of one wave of requests (as many
prompts as requests in flight, sent together) over the same wave's on the *anchor* — plain
decoding with the first thread count at the same load — in the same round. Ratios of the same
wave cancel what the prompt costs and what the shared machine was doing that minute.

The race: each phase measures its cells round after round; a cell whose interval lies wholly
below the leader's is dropped; the phase ends once the leader's interval is clear of every
other cell's (after ``min_rounds``) or after ``max_rounds``. Phases: the coarse grid, with the
drafter in its first GGUF type; the refinement around its best drafter setting (draft length
± 1, p-min ± a step, the other thread counts, the other GGUF types at the draft lengths around
it); the load, the best drafter setting against plain at each in-flight count.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

PLAIN = "plain"
DRAFT = "draft"
NGRAMS = ("ngram-mod", "ngram-simple")


@dataclass(frozen=True, order=True)
class Cell:
    """One way to serve; ``n``, ``p_min`` and ``gguf`` (the drafter file's GGUF type) only for the drafter."""

    method: str
    threads: int
    in_flight: int = 1
    n: int = 0
    p_min: float = 0.0
    gguf: str = ""

    @property
    def key(self) -> str:
        """The cell as rounds files and reports name it: ``draft n=2 p-min=0.5 gguf=f16 t=2 np=1``."""
        setting = f" n={self.n} p-min={self.p_min:g} gguf={self.gguf}" if self.method == DRAFT else ""
        return f"{self.method}{setting} t={self.threads} np={self.in_flight}"

    @classmethod
    def from_key(cls, key: str) -> Cell:
        method, *fields = key.split(" ")
        values = dict(f.split("=") for f in fields)
        return cls(
            method,
            int(values["t"]),
            int(values["np"]),
            int(values.get("n", 0)),
            float(values.get("p-min", 0.0)),
            values.get("gguf", ""),
        )

    @property
    def drafted(self) -> bool:
        return self.method == DRAFT

    def anchor(self, threads: int) -> Cell:
        """Plain decoding with ``threads`` (the first thread count) at this cell's load."""
        return Cell(PLAIN, threads, self.in_flight)


@dataclass(frozen=True)
class Estimate:
    """A cell's speed-up over its anchor: the geometric mean of its ratios and a t interval."""

    speedup: float
    low: float
    high: float
    samples: int


def estimate(ratios: list[float], confidence: float) -> Estimate:
    """The mean of log ratios with a Student-t interval (infinite with fewer than two samples)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Estimate(math.exp(mean), 0.0, math.inf, len(logs))
    half = t_quantile((1 + confidence) / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Estimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish–Fisher expansion about the normal one (Abramowitz &
    Stegun 26.7.5): within 2% from 2 degrees of freedom, 0.1% from 5."""
    z = statistics.NormalDist().inv_cdf(p)
    g = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / df ** (i + 1) for i, term in enumerate(g))


@dataclass(frozen=True)
class Race:
    leader: Cell
    dropped: frozenset[Cell]
    """Cells whose interval lies wholly below the leader's."""
    separated: bool
    """The leader's interval is clear of every other cell's."""


def race(estimates: dict[Cell, Estimate], eligible: set[Cell]) -> Race:
    """The leader among ``eligible`` cells (those whose outputs were plain's), by speed-up."""
    leader = max(eligible, key=lambda c: (estimates[c].speedup, c))
    floor = estimates[leader].low
    others = [c for c in estimates if c != leader]
    dropped = frozenset(c for c in others if estimates[c].high < floor)
    return Race(leader, dropped, all(c in dropped for c in others))


def ratios(round_: dict[str, dict], cell: Cell, threads: int) -> list[float]:
    """``cell``'s ratios in one measured round (cell key -> ``waves``: [tokens, seconds] each)."""
    own = round_[cell.key]["waves"]
    anchor = round_[cell.anchor(threads).key]["waves"]
    return [(t / s) / (at / a_s) for (t, s), (at, a_s) in zip(own, anchor) if s > 0 and a_s > 0 and at > 0]


def coarse(threads: int, longest: int, p_mins: list[float], gguf: str) -> list[Cell]:
    """Plain, the n-gram methods, and the drafter (in GGUF type ``gguf``) at draft lengths 1, the
    middle and ``longest`` at each p-min: every corner of the grid a setting can hide in, one
    thread count."""
    lengths = sorted({1, (1 + longest) // 2, longest})
    drafted = [Cell(DRAFT, threads, 1, n, p, gguf) for p in p_mins for n in lengths]
    return [Cell(PLAIN, threads), *(Cell(m, threads) for m in NGRAMS), *drafted]


def refine(
    best: Cell, longest: int, p_mins: list[float], step: float, threads: list[int], ggufs: list[str]
) -> list[Cell]:
    """Around the coarse phase's best drafter setting: the draft lengths either side (and any
    between the coarse ones), p-min a ``step`` either side, the best setting and plain at every
    other thread count, and the drafter in every other GGUF type of ``ggufs`` at the best p-min
    and those draft lengths (a cheaper draft step can pay for a longer draft). ``p_mins``: the
    values the family serves at all ([0] when it has no threshold)."""
    lengths = range(max(1, best.n - 1), min(longest, best.n + 1) + 1)
    served = p_mins != [0.0]
    nearby = {round(best.p_min + d, 4) for d in (-step, 0.0, step)} if served else {0.0}
    values = sorted(p for p in nearby if 0.0 <= p < 1.0)
    cells = [Cell(DRAFT, best.threads, 1, n, p, best.gguf) for p in values for n in lengths]
    for t in threads:
        if t != best.threads:
            cells += [Cell(DRAFT, t, 1, best.n, best.p_min, best.gguf), Cell(PLAIN, t)]
    for gguf in ggufs:
        if gguf != best.gguf:
            cells += [Cell(DRAFT, best.threads, 1, n, best.p_min, gguf) for n in lengths]
    return cells


def load(best: Cell, baseline: Cell, in_flight: list[int], longest: int) -> list[Cell]:
    """At each in-flight count: the drafter at every draft length at the best setting's p-min,
    GGUF type and threads (the plot's lines), and the best draftless method."""
    cells = []
    for k in in_flight:
        cells += [Cell(DRAFT, best.threads, k, n, best.p_min, best.gguf) for n in range(1, longest + 1)]
        if baseline.method != PLAIN:
            cells.append(Cell(baseline.method, baseline.threads, k))
    return cells


def crossover(best_by_load: dict[int, Estimate]) -> int | None:
    """The fewest requests in flight at which even the drafter's fastest setting at that load is
    slower than plain decoding at it (None: it wins at every load measured)."""
    losing = [k for k, e in sorted(best_by_load.items()) if e.speedup < 1.0]
    return losing[0] if losing else None
