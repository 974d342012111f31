"""Prompt lookup proposes what followed the latest earlier occurrence of the recent n-gram."""

from __future__ import annotations

from eyas.speculate.lookup import PromptLookup


def test_proposes_the_continuation_of_the_longest_recent_match():
    p = PromptLookup(max_ngram=3)
    p.reset([1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7])
    p.append(None, [2, 3])
    # last 3-gram [7, 2, 3] never occurred; [2, 3] last occurred before 4, 6, 7.
    assert p.propose(3) == ([4, 6, 7], None)
    assert p.propose(1) == ([4], None)


def test_nothing_to_copy_proposes_nothing():
    p = PromptLookup()
    p.reset([1, 2, 3])
    assert p.propose(3) == ([], None)
    p.append(None, [1])
    assert p.propose(3) == ([2, 3, 1], None)
