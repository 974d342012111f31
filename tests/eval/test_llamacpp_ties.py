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


def test_a_difference_in_any_round_fails_the_check_not_only_in_the_last():
    """Eval's llama.cpp check once kept only the last round's outputs: a round-one difference
    that the second round happened not to repeat was reported identical."""
    from types import SimpleNamespace

    from eyas.eval.llamacpp_engine import lossless_rounds

    prompts = [SimpleNamespace(id="a"), SimpleNamespace(id="b")]
    reference = {"a": PLAIN, "b": PLAIN}
    rounds = [{"a": [5, 6, 43, 8], "b": PLAIN}, {"a": PLAIN, "b": PLAIN}]
    probs = {"a": (PLAIN, _top2(2, 7, 42, 0.002))}
    check = lossless_rounds(prompts, rounds, reference, probs, limit=0.01)
    assert check == {"checked": 4, "identical": 3, "float_ties": [], "mismatched": ["a"]}
    rounds[0]["a"] = [5, 6, 42, 1]  # onto plain's runner-up where its top two were 0.002 apart
    assert lossless_rounds(prompts, rounds, reference, probs, limit=0.01)["float_ties"][0]["prompt"] == "a"
