"""Training on a real full disk (its run directory on a tmpfs, filled from outside after the
first checkpoint): it stops at that checkpoint with exit 7, and once the disk is grown the same
command finishes bit for bit as an uninterrupted run."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import eyas.train
from eyas.space import EXIT_CODE
from eyas.train.checkpoint import checkpoints_dir
from eyas.train.metrics import read_metrics
from tests.disks import fill_once, grow, small_disk
from tests.train.conftest import load_tiny, subprocess_env, write_config

SETTINGS = {"max_steps": 4, "epochs": 10.0, "checkpoint_every": 2}


@pytest.mark.slow
def test_a_disk_that_fills_mid_training_stops_at_a_checkpoint_and_resumes_bit_for_bit(merged_run, tmp_path):
    eyas.train.run(load_tiny(merged_run, **SETTINGS), quiet=True)
    with small_disk(tmp_path / "disk", "256M") as disk:
        run = disk / "run"
        shutil.copytree(merged_run, run, ignore=shutil.ignore_patterns("train"))
        command = [sys.executable, "-m", "eyas", "train", str(write_config(run, **SETTINGS))]
        first = checkpoints_dir(run / "train") / "step-00000002"
        proc = subprocess.Popen(
            command, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ballast = fill_once(proc, first.is_dir, disk)
        said = " ".join(proc.communicate(timeout=600)[0].split())
        assert proc.returncode == EXIT_CODE, said
        assert "the disk is full writing" in said and "nothing committed was lost" in said, said
        assert sorted(p.name for p in checkpoints_dir(run / "train").iterdir()) == ["step-00000002"], (
            "the checkpoint the disk could not hold is not left half-written"
        )
        assert not (run / "train" / "final").exists()

        grow(disk, "512M")
        ballast.unlink()
        resumed = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        straight, again = (read_metrics(d / "train" / "metrics.jsonl") for d in (merged_run, run))
        assert [r["step"] for r in again] == [1, 2, 3, 4]
        for a, b in zip(straight, again):
            assert a["loss"] == b["loss"] and a["lr"] == b["lr"]
        w1 = load_file(str(merged_run / "train" / "final" / "model.safetensors"))
        w2 = load_file(str(run / "train" / "final" / "model.safetensors"))
        assert all(torch.equal(w1[k], w2[k]) for k in w1)
