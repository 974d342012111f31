"""Training runs on the embedded target: loss goes down, metrics, eval, exact resume, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import eyas.train
from eyas.config import ConfigError
from eyas.drafter.model import Eagle3Drafter
from eyas.stage import StageError
from eyas.train.metrics import read_metrics
from tests.train.conftest import copy_run, load_tiny, subprocess_env, write_config


@pytest.mark.slow
def test_loss_goes_down_with_default_drafter_sizes(merged_run, model):
    # Default hidden/heads/MLP and the default 32,000-id draft vocabulary (padded: the tiny
    # corpus has far fewer distinct tokens), a short unroll to keep CPU time small.
    config = load_tiny(merged_run, intermediate_size=None, draft_vocab_size=None, lr=1e-3, max_steps=6, epochs=10.0)
    result = eyas.train.run(config, quiet=True)
    rows = read_metrics(merged_run / "train" / "metrics.jsonl")
    losses = [r["loss"] for r in rows]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert sum(losses[-2:]) < 0.7 * sum(losses[:2]), losses
    assert all(len(r["acc"]) == 3 and r["tokens_per_s"] > 0 for r in rows)
    ev = result["eval"]
    assert ev["step"] == 6 and ev["samples"] == 2 and len(ev["acc"]) == 3
    assert ev["acceptance_length"] == pytest.approx(
        1 + ev["acc"][0] + ev["acc"][0] * ev["acc"][1] + ev["acc"][0] * ev["acc"][1] * ev["acc"][2]
    )
    assert read_metrics(merged_run / "train" / "metrics.jsonl", "eval")[-1]["step"] == 6
    drafter = Eagle3Drafter.load(merged_run / "train" / "final", model)
    assert drafter.spec.draft_vocab_size == 32000 and drafter.spec.intermediate_size == 1536


@pytest.mark.slow
def test_resumed_run_in_fresh_process_continues_bit_for_bit(merged_run, tmp_path):
    other = copy_run(merged_run, tmp_path / "resumed")
    settings = {"max_steps": 4, "epochs": 10.0, "checkpoint_every": 2}
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True)
    straight = read_metrics(merged_run / "train" / "metrics.jsonl")

    first = eyas.train.run(load_tiny(other, **settings), quiet=True, stop_after=3)
    assert first["step"] == 3 and first["final"] is None
    # Drop the step-3 checkpoint so the fresh process resumes from step 2 and redoes step 3
    # over the metrics lines it already wrote.
    import shutil

    shutil.rmtree(other / "train" / "checkpoints" / "step-00000003")
    done = subprocess.run(
        [sys.executable, "-m", "eyas", "train", str(write_config(other, **settings))],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "simulated acceptance length" in done.stdout + done.stderr
    resumed = read_metrics(other / "train" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed):
        assert a["loss"] == b["loss"] and a["loss_steps"] == b["loss_steps"] and a["lr"] == b["lr"]
    w1 = load_file(str(merged_run / "train" / "final" / "model.safetensors"))
    w2 = load_file(str(other / "train" / "final" / "model.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


@pytest.mark.slow
def test_resume_refuses_changed_settings_but_allows_more_steps(merged_run):
    eyas.train.run(load_tiny(merged_run, max_steps=1), quiet=True)
    with pytest.raises(StageError, match=r"step-00000001: made with other settings \(train.lr\)"):
        eyas.train.run(load_tiny(merged_run, max_steps=2, lr=1e-4), quiet=True)
    result = eyas.train.run(load_tiny(merged_run, max_steps=2), quiet=True)
    assert result["step"] == 2
    assert [r["step"] for r in read_metrics(merged_run / "train" / "metrics.jsonl")] == [1, 2]


def test_missing_corpus_is_a_stage_error_naming_merge(tmp_path):
    with pytest.raises(StageError, match="merge"):
        eyas.train.run(load_tiny(tmp_path / "empty"), quiet=True)


def test_hidden_size_other_than_targets_is_rejected(merged_run):
    with pytest.raises(ConfigError, match="train.hidden_size"):
        eyas.train.run(load_tiny(merged_run, hidden_size=256), quiet=True)


def test_online_training_refuses_unservable_aux_layers(merged_run):
    config = load_tiny(merged_run)
    config = config.model_copy(update={"extract": config.extract.model_copy(update={"aux_layers": [3, 1, 2]})})
    with pytest.raises(ConfigError, match=r"extract\.aux_layers: \[3, 1, 2\] must be distinct and strictly ascending"):
        eyas.train.run(config, quiet=True)
