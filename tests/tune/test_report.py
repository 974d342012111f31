"""Tune's verdict: a drafter is told to serve only when its speed-up stands clear of every way to
decode without it (no server needed)."""

from __future__ import annotations

from eyas.tune.report import serves, verdict

BEST, NGRAM = "draft n=1 p-min=0 t=2 np=1", "ngram-simple t=2 np=1"


def _report(best: tuple[float, float, float], baseline: tuple[float, float, float]) -> dict:
    cell = lambda s, lo, hi: {"speedup": s, "low": lo, "high": hi}  # noqa: E731
    return {
        "cells": {BEST: cell(*best), NGRAM: cell(*baseline)},
        "best": BEST,
        "baseline": NGRAM,
        "crossover": None,
        "budget": {"minutes": 10, "exhausted": False},
        "phases": [{"name": "load"}],
    }


def test_a_lead_within_the_noise_is_no_reason_to_serve():
    """The demo's drafter, 1.03× against ngram-simple's 1.01× with overlapping intervals, was told
    to serve: the verdict compared point estimates."""
    report = _report((1.03, 0.99, 1.07), (1.01, 0.98, 1.04))
    assert not serves(report)
    text = verdict(report)
    assert not text.startswith("Serve it") and "within the measurement's noise" in text
    assert "1.03× [0.99, 1.07]" in text and "1.01× [0.98, 1.04]" in text


def test_a_clear_lead_is_served_and_a_slower_drafter_is_not():
    clear = _report((1.15, 1.13, 1.17), (1.01, 0.99, 1.03))
    assert serves(clear) and verdict(clear).startswith("Serve it with draft length 1, p-min 0, 2 threads: 1.15×")
    slower = _report((0.95, 0.93, 0.97), (1.01, 0.99, 1.03))
    assert not serves(slower) and verdict(slower).startswith("Do not serve this drafter")
