"""The tuner's planning: its intervals, its race and the cells each phase measures."""

from __future__ import annotations

import math
import random

import pytest

from eyas.tune.plan import DRAFT, PLAIN, Cell, Estimate, coarse, crossover, estimate, race, ratios, refine, t_quantile


@pytest.mark.parametrize(("df", "table"), [(2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042)])
def test_t_quantiles_match_the_tables(df, table):
    assert t_quantile(0.975, df) == pytest.approx(table, rel=0.02)


def test_the_interval_covers_the_true_speedup_about_as_often_as_it_says():
    rng = random.Random(0)
    covered = 0
    for _ in range(400):
        sample = [1.2 * math.exp(rng.gauss(0, 0.1)) for _ in range(6)]
        e = estimate(sample, 0.9)
        covered += e.low <= 1.2 <= e.high
    assert 0.85 <= covered / 400 <= 0.95


def test_a_single_sample_has_no_interval_yet():
    assert estimate([1.5], 0.95) == Estimate(1.5, 0.0, math.inf, 1)


def test_the_race_drops_what_is_clearly_slower_and_separates_only_when_all_are():
    fast, close, slow = Cell(DRAFT, 2, 1, 1, 0.5), Cell(DRAFT, 2, 1, 2, 0.5), Cell(PLAIN, 2)
    estimates = {fast: Estimate(1.3, 1.25, 1.35, 8), close: Estimate(1.28, 1.2, 1.33, 8), slow: Estimate(1, 1, 1, 8)}
    outcome = race(estimates, set(estimates))
    assert outcome.leader == fast and outcome.dropped == {slow} and not outcome.separated
    estimates[close] = Estimate(1.1, 1.05, 1.15, 8)
    assert race(estimates, set(estimates)).separated
    assert race(estimates, {close, slow}).leader == close, "a cell whose outputs differed never leads"


def test_ratios_pair_each_wave_with_the_anchors_same_wave():
    cell = Cell(DRAFT, 2, 2, 1, 0.0)
    round_ = {
        cell.key: {"waves": [[64, 1.0], [64, 4.0]]},
        Cell(PLAIN, 2, 2).key: {"waves": [[64, 2.0], [32, 1.0]]},
    }
    assert ratios(round_, cell, 2) == [2.0, 0.5]


def test_cells_round_trip_through_their_keys():
    for cell in [Cell(PLAIN, 2), Cell("ngram-mod", 1, 4), Cell(DRAFT, 2, 1, 3, 0.65, "q8_0")]:
        assert Cell.from_key(cell.key) == cell


def test_the_coarse_grid_has_the_corners_and_the_baselines():
    cells = coarse(2, 4, [0.0, 0.5], "f32")
    drafted = {(c.n, c.p_min, c.gguf) for c in cells if c.drafted}
    assert drafted == {(n, p, "f32") for n in (1, 2, 4) for p in (0.0, 0.5)}
    assert {c.method for c in cells if not c.drafted} == {PLAIN, "ngram-mod", "ngram-simple"}


def test_the_refinement_looks_around_the_best_and_at_the_other_thread_counts_and_draft_types():
    best = Cell(DRAFT, 2, 1, 2, 0.5, "f32")
    cells = refine(best, 4, [0.0, 0.5], 0.15, [2, 1], ["f32", "q8_0"])
    in_f32 = {(c.n, c.p_min) for c in cells if c.threads == 2 and c.gguf == "f32"}
    assert in_f32 == {(n, p) for n in (1, 2, 3) for p in (0.35, 0.5, 0.65)}
    assert {c for c in cells if c.threads == 1} == {Cell(DRAFT, 1, 1, 2, 0.5, "f32"), Cell(PLAIN, 1)}
    assert {c for c in cells if c.gguf == "q8_0"} == {Cell(DRAFT, 2, 1, n, 0.5, "q8_0") for n in (1, 2, 3)}
    only_zero = refine(Cell(DRAFT, 2, 1, 1, 0.0, "f32"), 3, [0.0], 0.15, [2], ["f32"])
    assert {c.p_min for c in only_zero} == {0.0}, "a family without a threshold is never served one"


def test_the_crossover_is_the_first_load_where_drafting_loses():
    loads = {1: Estimate(1.2, 1.1, 1.3, 8), 2: Estimate(1.05, 1, 1.1, 4), 4: Estimate(0.9, 0.8, 1, 4)}
    assert crossover(loads) == 4
    assert crossover({1: loads[1]}) is None
