"""Tune's verdict: a drafter is told to serve only when its speed-up stands clear of every way to
decode without it (no server needed)."""

from __future__ import annotations

import pytest

from eyas.tune.report import serves, verdict

BEST, NGRAM = "draft n=1 p-min=0 gguf=q8_0 t=2 np=1", "ngram-simple t=2 np=1"


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
    assert serves(clear) and verdict(clear).startswith(
        "Serve it with draft length 1, p-min 0, q8_0 drafter, 2 threads: 1.15×"
    )
    slower = _report((0.95, 0.93, 0.97), (1.01, 0.99, 1.03))
    assert not serves(slower) and verdict(slower).startswith("Do not serve this drafter")


def test_the_target_file_tune_serves_is_the_one_named_and_a_wrong_name_names_the_key(tmp_path):
    from eyas.config import ConfigError
    from eyas.target.llamacpp import TargetGgufs
    from eyas.tune import served_target

    converted = tmp_path / "t-f32.gguf"
    shipped = tmp_path / "t.Q4_1.gguf"
    mine = tmp_path / "t.Q8_0.gguf"
    for f in (converted, shipped, mine):
        f.write_bytes(b"GGUF")
    ggufs = TargetGgufs(tmp_path, converted, "f32", shipped)
    assert served_target(None, ggufs, "t") == converted
    assert served_target("shipped", ggufs, "t") == shipped
    assert served_target(str(mine), ggufs, "t") == mine.resolve()
    with pytest.raises(ConfigError, match=r"tune.target_gguf: shipped: the target 'hub/t' does not ship as a GGUF"):
        served_target("shipped", TargetGgufs(tmp_path, converted, "f32", None), "hub/t")
    with pytest.raises(ConfigError, match=r"tune.target_gguf: '\S+missing.gguf' is not a GGUF file"):
        served_target(str(tmp_path / "missing.gguf"), ggufs, "t")
