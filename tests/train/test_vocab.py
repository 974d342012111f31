"""Draft vocabulary: frequency choice, mapping round trip, padding, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eyas.config import ConfigError
from eyas.drafter.vocab import build_vocab, count_answer_tokens, draft_vocab_size, load_vocab, save_vocab

ROWS = [
    {"input_ids": [5, 9, 9, 3, 7, 7, 7], "loss_mask": [0, 0, 1, 1, 1, 1, 1]},
    {"input_ids": [9, 2, 7, 3], "loss_mask": [1, 0, 1, 1]},
]


def test_counts_only_answer_tokens():
    counts = count_answer_tokens(ROWS, vocab_size=12)
    assert counts.tolist() == [0, 0, 0, 2, 0, 0, 0, 4, 0, 2, 0, 0]


def test_most_frequent_ids_sorted_and_round_trip():
    counts = count_answer_tokens(ROWS, vocab_size=12)
    d2t, t2d = build_vocab(counts, size=2)
    used = torch.arange(2) + d2t
    # 7 is most frequent; 3 and 9 tie at 2 and the smaller id wins.
    assert used.tolist() == [3, 7]
    assert t2d.nonzero().flatten().tolist() == [3, 7]
    assert (d2t >= 0).all()
    # Round trip: every target id in the vocab maps to its draft id and back.
    t2d_index = torch.cumsum(t2d.long(), 0) - 1
    for draft_id, target_id in enumerate(used.tolist()):
        assert t2d_index[target_id] == draft_id
        assert draft_id + d2t[draft_id] == target_id


def test_padding_with_unused_ids():
    counts = count_answer_tokens(ROWS, vocab_size=12)
    d2t, t2d = build_vocab(counts, size=6)
    used = (torch.arange(6) + d2t).tolist()
    # The three seen ids plus the three smallest unused ones (0, 1, 2).
    assert used == [0, 1, 2, 3, 7, 9]
    assert int(t2d.sum()) == 6
    assert used == sorted(used)


def test_default_size_and_bounds():
    assert draft_vocab_size(None, 49152) == 32000
    assert draft_vocab_size(None, 1000) == 1000
    with pytest.raises(ConfigError, match="train.draft_vocab_size"):
        draft_vocab_size(2000, 1000)


def test_save_load(tmp_path):
    d2t, t2d = build_vocab(np.array([0, 3, 1, 0, 5]), size=3)
    save_vocab(tmp_path / "vocab.safetensors", d2t, t2d)
    d2t2, t2d2 = load_vocab(tmp_path / "vocab.safetensors")
    assert torch.equal(d2t, d2t2) and torch.equal(t2d, t2d2)
