"""Training runs on the embedded target: loss goes down, metrics, eval, exact resume, errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import eyas.train
from eyas import pipeline
from eyas.config import ConfigError
from eyas.drafter.families import load_drafter
from eyas.paths import RunPaths
from eyas.stage import StageError, begin, check, digest, read_marker
from eyas.train.checkpoint import checkpoints_dir
from eyas.train.metrics import read_metrics
from tests.kills import kill_at_each
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
    drafter = load_drafter(merged_run / "train" / "final", model)
    assert drafter.spec.draft_vocab_size == 32000 and drafter.spec.intermediate_size == 1536


@pytest.mark.slow
def test_resumed_run_in_fresh_process_continues_bit_for_bit(merged_run, tmp_path):
    """With Muon beside AdamW (two optimizers, two schedules), an LK loss in a mix and D-PACE's weights."""
    other = copy_run(merged_run, tmp_path / "resumed")
    settings = {
        "max_steps": 4,
        "epochs": 10.0,
        "checkpoint_every": 2,
        "loss": {"lk_hybrid": 1.0, "ce": 0.1},
        "position_weighting": "dpace",
        "optimizer": "muon",
    }
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
    run = read_marker(other / "train" / "final" / "stage.json")["run"]
    assert run["total_cpu_seconds"] > run["cpu_seconds"], "the two steps before the resumed checkpoint count"
    for a, b in zip(straight, resumed):
        assert a["loss"] == b["loss"] and a["loss_steps"] == b["loss_steps"] and a["lr"] == b["lr"]
    w1 = load_file(str(merged_run / "train" / "final" / "model.safetensors"))
    w2 = load_file(str(other / "train" / "final" / "model.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


@pytest.mark.slow
def test_a_finished_drafter_is_never_rewritten_from_other_settings(merged_run):
    """A finished run once restored its final checkpoint under any new setting that its resume
    check left out, and wrote the old weights again; longer runs were reported up to date."""
    paths = RunPaths.of(load_tiny(merged_run))
    eyas.train.run(load_tiny(merged_run, max_steps=1), quiet=True)
    first = load_file(str(paths.train_final / "model.safetensors"))

    longer = load_tiny(merged_run, max_steps=2)
    state = check(longer, eyas.train.CONTRACT, paths)
    assert state.status == "stale" and state.extendable and state.changes == ["train.max_steps: 1 → 2"]
    assert pipeline.prepare(longer, "train")  # a longer run needs no --redo: it continues
    result = eyas.train.run(longer, quiet=True)
    marker = read_marker(paths.marker("train"))
    assert result["step"] == 2 and marker["run"]["continued_from_step"] == 1
    assert [r["step"] for r in read_metrics(paths.train_metrics)] == [1, 2]
    steps = [load_file(str(checkpoints_dir(paths.train_dir) / f"step-{n:08d}" / "model.safetensors")) for n in (1, 2)]
    # Step 2 learns at the longer schedule's rate, not the zero the shorter one ended at.
    assert not all(torch.equal(steps[0][k], steps[1][k]) for k in steps[0])
    # Step 1 followed the 1-step schedule, and τ was measured there: not what a fresh 2-step run
    # makes, so the marker (and every digest downstream) must not pass for that run's.
    assert marker["fingerprint"]["train.continued"] == [[0, 1], [1, 2]]
    assert digest(marker) != digest(begin(longer, eyas.train.CONTRACT, paths).marker)
    state = check(longer, eyas.train.CONTRACT, paths)
    assert state.status == "current" and state.why == (
        "up to date; continued from a shorter run, so not the drafter a fresh run trains: its learning-rate "
        "schedule was a 1-step one from step 0, then a 2-step one from step 1, and τ was also measured where a "
        "shorter run ended (step 1); delete its train directory to train it fresh"
    )
    assert eyas.train.run(longer, quiet=True)["step"] == 2  # now current: nothing runs
    longer_still = check(load_tiny(merged_run, max_steps=3), eyas.train.CONTRACT, paths)
    assert longer_still.extendable and longer_still.changes == ["train.max_steps: 2 → 3"]

    other = load_tiny(merged_run, max_steps=2, lr=1e-4)
    with pytest.raises(StageError, match=r"made with other settings or input \(train.lr: 0.003 → 0.0001\).*--redo"):
        pipeline.prepare(other, "train")
    assert not check(load_tiny(merged_run, max_steps=1), eyas.train.CONTRACT, paths).extendable  # shorter: retrain
    eyas.train.run(other, quiet=True, redo=True)
    retrained = read_marker(paths.marker("train"))
    assert retrained["fingerprint"]["train.lr"] == 1e-4 and "continued_from_step" not in retrained["run"]
    assert [r["step"] for r in read_metrics(paths.train_metrics)] == [1, 2]
    again = load_file(str(paths.train_final / "model.safetensors"))
    assert not all(torch.equal(first[k], again[k]) for k in first)
    assert not (merged_run / "train.redo").exists()


@pytest.mark.slow
def test_checkpoints_in_progress_made_otherwise_are_refused_or_discarded(merged_run):
    eyas.train.run(load_tiny(merged_run, max_steps=2, checkpoint_every=1), quiet=True, stop_after=1)
    with pytest.raises(StageError, match=r"step-00000001: made with other data or settings \(train.lr: .*--redo"):
        eyas.train.run(load_tiny(merged_run, max_steps=2, lr=1e-4), quiet=True)
    result = eyas.train.run(load_tiny(merged_run, max_steps=2, lr=1e-4), quiet=True, redo=True)
    assert result["step"] == 2
    assert [r["step"] for r in read_metrics(merged_run / "train" / "metrics.jsonl")] == [1, 2]


@pytest.mark.slow
def test_a_run_killed_in_the_middle_of_a_metrics_line_resumes(merged_run):
    """The half line a kill left in metrics.jsonl made every later run die parsing it."""
    settings = {"max_steps": 2, "epochs": 10.0, "checkpoint_every": 1, "tau_prompts": 0}
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True, stop_after=1)
    metrics = merged_run / "train" / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"split": "train", "step": 2, "lo')
    assert eyas.train.run(load_tiny(merged_run, **settings), quiet=True)["step"] == 2
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2]


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


def drafter_on_disk(run_dir) -> dict:
    """The finished drafter in ``train/``: its marker's digest, its weights and metrics, byte for byte."""
    train = run_dir / "train"
    return {
        "marker": digest(read_marker(train / "final" / "stage.json")),
        "weights": (train / "final" / "model.safetensors").read_bytes(),
        "metrics": (train / "metrics.jsonl").read_text(),
    }


@pytest.mark.slow
def test_a_retrain_killed_at_any_point_leaves_the_old_drafter_or_the_new_never_a_mix(merged_run):
    settings = {"max_steps": 6, "epochs": 10.0, "checkpoint_every": 1}
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True)
    old = drafter_on_disk(merged_run)
    config = write_config(merged_run, lr=1e-4, **settings)
    redo = merged_run / "train.redo"
    kill_points = [
        lambda: redo.is_dir(),
        lambda: (redo / "checkpoints" / "step-00000002").is_dir(),
        lambda: (redo / "checkpoints" / "step-00000006").is_dir(),
        lambda: (redo / "final").is_dir(),
    ]
    command = [sys.executable, "-m", "eyas", "train", str(config), "--redo", "-q"]
    seen = kill_at_each(command, kill_points, lambda: drafter_on_disk(merged_run), old, env=subprocess_env())
    if seen[-1] == "new":  # the retrain finished before the last kill: the new drafter, whole
        assert read_marker(merged_run / "train" / "final" / "stage.json")["fingerprint"]["train.lr"] == 1e-4
    assert seen[0] == "old", seen
    done = subprocess.run([sys.executable, "-m", "eyas", "train", str(config), "--redo", "-q"], env=subprocess_env())
    assert done.returncode == 0 and not redo.exists()
    new = drafter_on_disk(merged_run)
    assert new["marker"] != old["marker"] and new["weights"] != old["weights"]
    assert [r["step"] for r in read_metrics(merged_run / "train" / "metrics.jsonl")] == list(range(1, 7))
