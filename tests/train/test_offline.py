"""Offline training from extracted shards follows the online run (bf16 storage aside)."""

from __future__ import annotations

import pytest

import eyas.extract
import eyas.train
from eyas.train.metrics import read_metrics
from tests.train.conftest import copy_run, load_tiny


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_offline_from_shards_matches_online(merged_run, tmp_path, drafter):
    # DFlash reads the same three captured layers as its context features.
    settings = {"max_steps": 4, "epochs": 10.0, "drafter": drafter}
    offline = copy_run(merged_run, tmp_path / "offline")
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True)
    config = load_tiny(offline, "offline", eval_with_target=True, **settings)
    eyas.extract.run(config, quiet=True)
    result = eyas.train.run(config, quiet=True)
    online_rows = read_metrics(merged_run / "train" / "metrics.jsonl")
    offline_rows = read_metrics(offline / "train" / "metrics.jsonl")
    assert [r["tokens"] for r in offline_rows] == [r["tokens"] for r in online_rows]
    # Shards hold bf16 states: the curves agree to bf16 rounding, not bit for bit.
    for a, b in zip(online_rows, offline_rows):
        assert b["loss"] == pytest.approx(a["loss"], rel=0.02)
    assert offline_rows[-1]["loss"] < offline_rows[0]["loss"]
    assert len(result["eval"]["acc"]) == 3


@pytest.mark.slow
def test_offline_without_eval_reads_only_embedding_and_head(merged_run, monkeypatch):
    import eyas.train.loop as loop

    def refuse(*args, **kwargs):
        raise AssertionError("offline training must not load the whole target")

    config = load_tiny(merged_run, "offline", max_steps=2)
    eyas.extract.run(config, quiet=True)
    monkeypatch.setattr(loop, "load_model", refuse)
    result = eyas.train.run(config, quiet=True)
    assert result["eval"] is None and result["final"] is not None
    assert len(read_metrics(merged_run / "train" / "metrics.jsonl")) == 2
