"""The scaling curve's planning: subsets by prompt, steps by share, and the fitted line."""

from __future__ import annotations

import math
import random

import pytest

from eyas.merge.plan import base_prompt_id
from eyas.scaling.plan import Point, fit_log2, nested_subsets, subset_steps


def _ids() -> list[str]:
    """Prompts answered once, conversations of several turns, and a prompt shared by two datasets."""
    ids = [f"chat/p{i}" for i in range(40)]
    ids += [f"multi/c{i}#{turn}" for i in range(10) for turn in range(3)]
    ids += ["chat/shared", "code/shared"]
    return ids


def test_subsets_never_split_a_prompts_samples_and_nest():
    ids = _ids()
    subsets = nested_subsets(ids, [0.125, 0.25, 0.5], seed=0)
    prompts = {base_prompt_id(i) for i in ids}
    for fraction, subset in subsets.items():
        taken = {base_prompt_id(i) for i in subset}
        assert subset == {i for i in ids if base_prompt_id(i) in taken}, "every answer to a taken prompt is in"
        assert len(taken) == round(fraction * len(prompts))
    assert subsets[0.125] < subsets[0.25] < subsets[0.5]
    assert nested_subsets(ids, [0.25], seed=0)[0.25] == subsets[0.25], "the same seed, the same subset"
    assert nested_subsets(ids, [0.25], seed=1)[0.25] != subsets[0.25]


def test_subsets_train_their_share_of_the_full_runs_steps():
    assert [subset_steps(240, 176, n) for n in (22, 44, 88)] == [30, 60, 120]
    assert sum(subset_steps(240, 176, n) for n in (22, 44, 88)) <= 240
    assert subset_steps(240, 176, 1) == 1


def test_the_fit_recovers_a_planted_slope():
    rng = random.Random(0)
    planted, errors = 0.08, []
    for trial in range(200):
        points = []
        for samples in (22, 44, 88, 176, 352):
            se = 0.03
            points.append(Point(samples, 0.9 + planted * math.log2(samples) + rng.gauss(0, se), se))
        fit = fit_log2(points)
        errors.append((fit.slope - planted) / fit.slope_se)
    assert abs(sum(errors) / len(errors)) < 0.2, "unbiased"
    within = sum(abs(e) <= 1.96 for e in errors) / len(errors)
    assert 0.9 <= within <= 0.99, "the standard error is the slope's own spread"


def test_the_line_is_inverted_for_a_target_tau():
    exact = [Point(n, 0.8 + 0.1 * math.log2(n), 0.01) for n in (16, 32, 64)]
    fit = fit_log2(exact)
    assert fit.slope == pytest.approx(0.1) and fit.tau(128) == pytest.approx(1.5)
    samples, low, high = fit.samples_for(1.6)
    assert samples == pytest.approx(256) and low < 256 < high, "the range comes from the points' own errors"
    assert fit_log2([Point(16, 1.4, 0.01), Point(64, 1.3, 0.01)]).samples_for(1.6) is None
    with pytest.raises(ValueError, match="two sample counts"):
        fit_log2([Point(16, 1.4, 0.01), Point(16, 1.5, 0.01)])
