"""Two gloo ranks under torchrun (DDP and FSDP), stopped and resumed, follow the single-process loss curve on the same global batch."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

import eyas.train
from eyas.train.metrics import read_metrics
from tests.train.conftest import copy_run, load_tiny, subprocess_env, write_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
# DDP is family-blind (one drafter's parameters, however built): it runs with DFlash, whose blocks
# are drawn per sample, and FSDP with EAGLE-3.
@pytest.mark.parametrize(("parallel", "drafter"), [("fsdp", "eagle3"), ("ddp", "dflash")])
def test_two_ranks_match_one_process(merged_run, tmp_path, parallel, drafter):
    # DFlash draws its blocks per sample, so two ranks draw the blocks one process does.
    settings = {"max_steps": 4, "epochs": 10.0, "batch_size": 4, "parallel": parallel, "drafter": drafter}
    two = copy_run(merged_run, tmp_path / "ddp")
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True)
    config = write_config(two, **settings)
    # Two launches: the second resumes the first's step-2 checkpoint on both ranks.
    for extra in (["--stop-after", "2"], []):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "eyas",
            "train",
            str(config),
            "--quiet",
            *extra,
        ]
        done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    one_rows = read_metrics(merged_run / "train" / "metrics.jsonl")
    two_rows = read_metrics(two / "train" / "metrics.jsonl")
    assert [r["step"] for r in two_rows] == [1, 2, 3, 4]
    assert [r["tokens"] for r in two_rows] == [r["tokens"] for r in one_rows]
    for a, b in zip(one_rows, two_rows):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["acc"] == pytest.approx(a["acc"], abs=1e-6)
    assert read_metrics(two / "train" / "metrics.jsonl", "eval")[-1]["acc"] == pytest.approx(
        read_metrics(merged_run / "train" / "metrics.jsonl", "eval")[-1]["acc"], abs=0.05
    )
    assert (two / "train" / "final" / "model.safetensors").is_file()
