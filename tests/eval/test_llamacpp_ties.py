"""The llama.cpp lossless check tells a float tie from a real difference (no server needed)."""

from __future__ import annotations

from eyas.eval.llamacpp_engine import tie_margin

PLAIN = [5, 6, 7, 8]


def _top2(at: int, best: int, runner_up: int, gap: float) -> list[list[dict]]:
    """Plain's top two at every token: clear margins, except ``gap`` at position ``at``."""
    top2 = [[{"id": t, "logprob": -0.1}, {"id": 99, "logprob": -3.0}] for t in PLAIN]
    top2[at] = [{"id": best, "logprob": -0.69}, {"id": runner_up, "logprob": -0.69 - gap}]
    return top2


def test_a_departure_onto_plains_runner_up_at_a_near_tie_is_a_tie_with_its_margin():
    margin = tie_margin(PLAIN, [5, 6, 42, 1], _top2(2, 7, 42, 0.002), limit=0.01)
    assert margin is not None and abs(margin - 0.002) < 1e-9


def test_other_departures_are_real_differences():
    assert tie_margin(PLAIN, [5, 6, 42, 1], _top2(2, 7, 42, 0.05), limit=0.01) is None, "margin above the limit"
    assert tie_margin(PLAIN, [5, 6, 43, 1], _top2(2, 7, 42, 0.002), limit=0.01) is None, "not the runner-up"
    assert tie_margin(PLAIN, [5, 42, 7, 8], _top2(2, 7, 42, 0.002), limit=0.01) is None, "departs elsewhere"
    assert tie_margin(PLAIN, PLAIN[:3], _top2(2, 7, 42, 0.002), limit=0.01) is None, "stops early"
