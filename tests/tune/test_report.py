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


def test_with_requests_in_flight_a_setting_is_held_to_plain_decoding_at_its_own_load(tmp_path):
    """On the shipped Q4_1, plain decoding with 2 requests in flight departed from one-at-a-time
    decoding on one prompt beyond a float tie, and every cell of the load phase — plain decoding
    itself among them — was reported as not lossless."""
    from eyas.config import RunConfig
    from eyas.eval.prompts import EvalPrompt
    from eyas.tune import Lossless, Served
    from eyas.tune.plan import DRAFT, PLAIN, Cell

    prompts = [EvalPrompt("a", "d", [1]), EvalPrompt("b", "d", [2])]
    served = Served(None, tmp_path / "t.gguf", {}, "draft-eagle3", prompts)
    checks = Lossless(RunConfig(run_dir=str(tmp_path)), served, tmp_path, 2)
    far_apart = [[{"id": 5, "logprob": -0.1}, {"id": 7, "logprob": -3.0}]] * 3
    one_at_a_time = {"a": [1, 2, 3], "b": [4, 5, 6]}
    batched = {"a": [1, 2, 3], "b": [4, 7, 8]}
    checks.top2 = {"b": ([4, 5, 6], far_apart)}  # plain's own top two where outputs depart: no tie
    drafted_alone, drafted_in_flight = Cell(DRAFT, 2, 1, 1, 0.0, "q8_0"), Cell(DRAFT, 2, 2, 1, 0.0, "q8_0")
    wrong_in_flight = Cell(DRAFT, 2, 2, 2, 0.0, "q8_0")
    checks.add(
        {
            "cells": {
                Cell(PLAIN, 2).key: {"outputs": one_at_a_time},
                Cell(PLAIN, 2, 2).key: {"outputs": batched},
                drafted_alone.key: {"outputs": batched},
                drafted_in_flight.key: {"outputs": batched},
                wrong_in_flight.key: {"outputs": {"a": [1, 2, 3], "b": [4, 9, 9]}},
            }
        }
    )
    assert checks.passes(Cell(PLAIN, 2, 2)) and checks.passes(drafted_in_flight)
    assert checks.result(drafted_in_flight)["identical"] == 2
    assert checks.result(wrong_in_flight)["mismatched"] == ["b"]
    assert checks.result(drafted_alone)["mismatched"] == ["b"], "one request at a time is held to one at a time"
    assert checks.batched_departures() == {"2": ["b"]}
    report = {**_report((0.9, 0.85, 0.95), (1.0, 0.98, 1.02)), "batched_departures": {"2": ["b"]}, "prompts": 2}
    assert "With 2 requests in flight, plain decoding itself departs" in verdict(report)
