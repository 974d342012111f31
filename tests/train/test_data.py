"""Online batches: states from the target, right padding, and the in-memory cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import eyas.train
from eyas.target.capture import capture, default_aux_layers
from eyas.train.data import OnlineSource, Sample
from eyas.train.metrics import read_metrics
from tests.train.conftest import copy_run, load_tiny


@pytest.fixture
def samples(corpus_rows):
    rows = corpus_rows[0][:3]
    return [Sample(np.asarray(r["input_ids"]), np.asarray(r["loss_mask"], dtype=bool)) for r in rows]


def test_batches_are_right_padded_states_of_each_sample(samples, model):
    layers = default_aux_layers(30)
    batch = OnlineSource(samples, model, layers, torch.device("cpu")).batch([2, 0])
    assert batch.tokens == len(samples[2].input_ids) + len(samples[0].input_ids)
    alone = capture(model, torch.from_numpy(samples[0].input_ids)[None], aux_layers=layers)
    n = len(samples[0].input_ids)
    torch.testing.assert_close(batch.aux[1, :n], alone.aux[0], atol=1e-4, rtol=1e-4)
    assert batch.loss_mask[1, n:].sum() == 0 and batch.input_ids[1, :n].tolist() == samples[0].input_ids.tolist()


def test_cache_gives_the_same_states_whatever_the_batch(samples, model):
    source = OnlineSource(samples, model, default_aux_layers(30), torch.device("cpu"), cache=True)
    first = source.batch([0, 1])
    assert sorted(source.cache) == [0, 1]
    again = source.batch([1, 2, 0])
    assert sorted(source.cache) == [0, 1, 2]
    n0, n1 = len(samples[0].input_ids), len(samples[1].input_ids)
    assert torch.equal(first.aux[0, :n0], again.aux[2, :n0]) and torch.equal(first.final[1, :n1], again.final[0, :n1])
    plain = OnlineSource(samples, model, default_aux_layers(30), torch.device("cpu")).batch([0, 1])
    # Beyond each sample's length the padded batch holds states of padding, the cache zeros.
    torch.testing.assert_close(first.aux[0, :n0], plain.aux[0, :n0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first.final[1, :n1], plain.final[1, :n1], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_cached_training_follows_the_uncached_curve(merged_run, tmp_path):
    cached = copy_run(merged_run, tmp_path / "cached")
    settings = {"max_steps": 4, "epochs": 10.0}
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True)
    eyas.train.run(load_tiny(cached, cache_states=True, **settings), quiet=True)
    plain = read_metrics(merged_run / "train" / "metrics.jsonl")
    for a, b in zip(plain, read_metrics(cached / "train" / "metrics.jsonl")):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
