"""Pure decisions of ``eyas scaling``: which samples each subset holds, how long each trains,
and the line through τ against log₂(samples) with what it predicts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from eyas.merge.plan import base_prompt_id, hash64


def nested_subsets(sample_ids: list[str], fractions: list[float], seed: int) -> dict[float, set[str]]:
    """Fraction -> the sample ids of the first ``fraction`` of the prompts, in a seeded order:
    every answer to a prompt goes with it (a prompt answered twice is not two independent
    samples), and each subset holds every smaller one, so the curve's points differ only by
    the data added."""
    prompts: dict[str, list[str]] = {}
    for sample in sample_ids:
        prompts.setdefault(base_prompt_id(sample), []).append(sample)
    order = sorted(prompts, key=lambda p: (hash64(seed, "scaling", p), p))
    return {f: {s for p in order[: max(1, round(f * len(order)))] for s in prompts[p]} for f in fractions}


def subset_steps(full_steps: int, full_samples: int, samples: int) -> int:
    """Optimizer steps for a subset: the full run's passes over each sample, so a subset costs
    its share of the full run's training and the subsets together less than it."""
    return max(1, round(full_steps * samples / full_samples))


@dataclass(frozen=True)
class Point:
    samples: int
    tau: float
    se: float
    """Standard error of τ from its spread over the held-out prompts."""


@dataclass(frozen=True)
class Fit:
    """τ = intercept + slope · log₂(samples), weighted by each point's 1/se²."""

    intercept: float
    slope: float
    slope_se: float
    center: float
    """The weighted mean of log₂(samples), where the line is best known."""
    center_se: float
    """The line's standard error there."""

    def tau(self, samples: float) -> float:
        return self.intercept + self.slope * math.log2(samples)

    def tau_se(self, samples: float) -> float:
        """The line's standard error at ``samples``: growing with the distance from the points' centre."""
        return math.hypot(self.center_se, (math.log2(samples) - self.center) * self.slope_se)

    def samples_for(self, tau: float) -> tuple[float, float, float] | None:
        """Samples at which the line reaches ``tau``, and the range for the slope ± its standard
        error (pivoting about the points' centre); None when the slope is not positive."""
        if self.slope <= 0:
            return None
        at_center = self.tau(2**self.center)

        def at(slope: float) -> float:
            return 2 ** (self.center + (tau - at_center) / slope) if slope > 0 else math.inf

        ends = sorted([at(self.slope - self.slope_se), at(self.slope + self.slope_se)])
        return at(self.slope), ends[0], ends[1]


def fit_log2(points: list[Point]) -> Fit:
    """Weighted least squares of τ on log₂(samples); the slope's standard error from the
    weights (each point's own error), so it is the uncertainty the held-out prompts leave."""
    if len({p.samples for p in points}) < 2:
        raise ValueError("a line needs points at two sample counts at least")
    floor = min((p.se for p in points if p.se > 0), default=1.0)
    weights = [1 / max(p.se, floor) ** 2 for p in points]
    xs = [math.log2(p.samples) for p in points]
    total = sum(weights)
    x_bar = sum(w * x for w, x in zip(weights, xs)) / total
    y_bar = sum(w * p.tau for w, p in zip(weights, points)) / total
    sxx = sum(w * (x - x_bar) ** 2 for w, x in zip(weights, xs))
    slope = sum(w * (x - x_bar) * (p.tau - y_bar) for w, x, p in zip(weights, xs, points)) / sxx
    return Fit(y_bar - slope * x_bar, slope, math.sqrt(1 / sxx), x_bar, math.sqrt(1 / total))
