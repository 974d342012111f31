"""train.keep: the share of the train split a run trains on, the flattest by the target's
distribution (SFDD) or a seeded random one, on the embedded target."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eyas.train
from eyas.paths import RunPaths
from eyas.stage import read_marker
from eyas.target.heads import from_model
from eyas.train.data import OnlineSource, Sample
from eyas.train.distributed import World
from eyas.train.metrics import read_metrics
from eyas.train.selection import peakedness, sample_peakedness, select
from tests.train.conftest import load_tiny

CPU = World(0, 1, torch.device("cpu"))


def test_peakedness_is_one_minus_the_cosine_to_the_uniform_distribution():
    vocab = 1000
    uniform, peaked, drawn = (
        torch.zeros(vocab),
        torch.full((vocab,), -1e4),
        torch.randn(vocab, generator=torch.Generator().manual_seed(0)),
    )
    peaked[3] = 0.0
    p = torch.softmax(drawn, dim=-1)
    by_definition = 1 - F.cosine_similarity(p, torch.full_like(p, 1 / vocab), dim=0)
    assert float(peakedness(drawn)) == pytest.approx(float(by_definition), rel=1e-5)
    assert float(peakedness(uniform)) == pytest.approx(0.0, abs=1e-6)
    assert float(peakedness(peaked)) == pytest.approx(1 - 1 / math.sqrt(vocab), rel=1e-6)
    assert float(peakedness(uniform)) < float(peakedness(drawn)) < float(peakedness(peaked))


@pytest.fixture(scope="module")
def source(model, corpus_rows):
    train_rows, _ = corpus_rows
    samples = [Sample(np.asarray(r["input_ids"]), np.asarray(r["loss_mask"], dtype=bool)) for r in train_rows]
    return OnlineSource(samples, model, [1, 14, 26], torch.device("cpu"), cache=True)


def test_the_flattest_half_is_ranked_by_the_targets_own_logits_on_the_trained_positions(model, source, tmp_path):
    lm_head = from_model(model).lm_head
    scores = sample_peakedness(source, lm_head, CPU)
    with torch.inference_mode():
        for i, sample in enumerate(source.samples):
            logits = model(torch.from_numpy(sample.input_ids)[None]).logits[0]
            trained = np.flatnonzero(sample.loss_mask[1:])  # positions whose next token is an answer token
            assert float(scores[i]) == pytest.approx(float(peakedness(logits[trained]).mean()), rel=1e-4)
    assert len(set(scores.tolist())) == len(source), "samples this different score differently"

    kept = select(load_tiny(tmp_path, keep=0.5).train, source, lm_head, CPU)
    assert len(kept) == len(source) // 2
    assert kept.kept == sorted(torch.argsort(scores)[: len(source) // 2].tolist())
    assert max(scores[kept.kept]) < min(scores[[i for i in range(len(source)) if i not in kept.kept]])
    assert kept.lengths() == [len(source.samples[i].input_ids) for i in kept.kept]
    first = kept.batch([0])
    assert torch.equal(first.input_ids[0], torch.from_numpy(source.samples[kept.kept[0]].input_ids))


def test_a_random_share_is_drawn_with_the_seed(model, source, tmp_path):
    lm_head = from_model(model).lm_head

    def pick(seed: int) -> list[int]:
        return select(load_tiny(tmp_path, keep=0.5, keep_by="random", seed=seed).train, source, lm_head, CPU).kept

    assert pick(0) == pick(0) and len(pick(0)) == len(source) // 2
    assert pick(0) != pick(1)
    assert select(load_tiny(tmp_path).train, source, lm_head, CPU) is source


def test_a_run_trains_on_the_kept_share_and_its_fingerprint_says_so(merged_run):
    config = load_tiny(merged_run, keep=0.5, epochs=2.0, tau_prompts=0)
    eyas.train.run(config, quiet=True)
    rows = read_metrics(merged_run / "train" / "metrics.jsonl")
    # 8 samples, 4 kept: one batch of 4 per epoch, so two epochs are two steps.
    assert [(r["step"], r["epoch"]) for r in rows] == [(1, 1.0), (2, 2.0)]
    marker = read_marker(RunPaths.of(config).marker("train"))
    assert marker["run"]["samples"] == 4
    assert marker["fingerprint"]["train.keep"] == 0.5 and marker["fingerprint"]["train.keep_by"] == "flatness"
