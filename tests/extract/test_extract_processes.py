"""Extraction as real processes: killed with SIGKILL and resumed; split across ranks by torchrun."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eyas.extract import storage
from eyas.extract.reader import HiddenStates
from eyas.merge.reader import iter_split
from eyas.paths import RunPaths
from eyas.stage import digest, read_marker
from tests.kills import child_groups, kill_at_each, processes

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def write_config(merged_run, path: Path, **extract) -> Path:
    data = merged_run.model_dump(mode="json")
    data["extract"].update(extract)
    path.write_text(yaml.safe_dump(data))
    return path


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def kill_after_first_shard(
    config: Path, hidden: Path, orphans: list[int] | None = None, engine: bool = False
) -> tuple[str, dict[Path, int]]:
    """Start ``eyas extract`` and SIGKILL it (``engine``: its vLLM child instead) once it has
    finished a shard; returns what it said and the finished shards' mtimes.

    ``orphans`` (when given) receives the processes of the killed run's child process groups
    still alive a minute after the kill: none should be (vLLM's engine outlives its parent).
    """
    before = set(hidden.glob("shard-*.json"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "eyas", "extract", str(config), "-q"],
        env=env() | {"COLUMNS": "400"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while set(hidden.glob("shard-*.json")) <= before and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    groups = child_groups(proc.pid)
    if engine:
        assert groups, "the vLLM child is running"
        for group in groups:
            os.kill(group, signal.SIGKILL)  # its leader alone, as an out-of-memory kill takes one process
    else:
        proc.send_signal(signal.SIGKILL)
    said = " ".join(proc.communicate(timeout=300)[0].split())
    if orphans is not None:
        assert groups, "the vLLM child leads a process group of its own, so it can take its engine down"
        deadline = time.monotonic() + 60
        while [p for p, (_, g) in processes().items() if g in groups] and time.monotonic() < deadline:
            time.sleep(0.5)
        orphans.extend(p for p, (_, g) in processes().items() if g in groups)
    done = sorted(hidden.glob("shard-*.json"))
    assert done and not (hidden / "index.json").exists() or len(done) == 6
    if len(done) == 6:  # the kill came too late to interrupt: take the last shard away instead
        for p in (done[-1], done[-1].with_suffix(".safetensors")):
            p.unlink()
        done = done[:-1]
    return said, {p.with_suffix(".safetensors"): p.with_suffix(".safetensors").stat().st_mtime_ns for p in done}


def resume(config: Path, merged_run, finished: dict[Path, int]) -> HiddenStates:
    """Rerun ``eyas extract``; it must leave the finished shards alone and complete the set."""
    subprocess.run([sys.executable, "-m", "eyas", "extract", str(config), "-q"], env=env(), cwd=ROOT, check=True)
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
    hidden = RunPaths.of(merged_run).hidden_dir
    states = HiddenStates(hidden)
    assert len(states) == 6 and states.verify() == [] and not list(hidden.glob("*.tmp-*"))
    assert [states[i].id for i in range(6)] == [r["id"] for r in iter_split(RunPaths.of(merged_run), "train")]
    run = read_marker(hidden / "stage.json")["run"]
    kept = [json.loads(p.with_suffix(".json").read_text()) for p in finished]
    assert run["total_seconds"] == pytest.approx(run["seconds"] + sum(s["seconds"] for s in kept), abs=0.01)
    assert run["total_cpu_seconds"] == pytest.approx(run["cpu_seconds"] + sum(s["cpu_seconds"] for s in kept), abs=0.01)
    return states


def test_killed_extract_resumes_without_redoing_finished_shards(merged_run, tmp_path):
    config = write_config(merged_run, tmp_path / "run.yaml", shard_tokens=1)  # one sample per shard
    resume(config, merged_run, kill_after_first_shard(config, RunPaths.of(merged_run).hidden_dir)[1])


def test_torchrun_ranks_write_their_own_shards(merged_run, tmp_path):
    config = write_config(merged_run, tmp_path / "run.yaml", shard_tokens=1)
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "eyas", "extract", str(config), "-q"],
        env=env(),
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    hidden = RunPaths.of(merged_run).hidden_dir
    ranks = [json.loads((hidden / f"shard-{s:05d}.json").read_text())["rank"] for s in range(6)]
    assert ranks == [0, 1, 0, 1, 0, 1]
    states = HiddenStates(hidden)
    assert len(states) == 6 and states.verify() == []


def whole(hidden: Path) -> dict:
    """What ``hidden/`` holds, checked to be one complete set: its marker, the aux layers it names,
    and every shard file with the checksum its index gives (no shard beside them)."""
    marker = read_marker(hidden / "stage.json")
    index = json.loads((hidden / "index.json").read_text())
    files = {s["file"]: s["sha256"] for s in index["shards"]}
    assert {p.name for p in hidden.glob("shard-*.safetensors")} == set(files)
    assert all(storage.file_sha256(hidden / f) == sha for f, sha in files.items())
    assert index["aux_layers"] == marker["fingerprint"]["extract.aux_layers"]
    return {"marker": digest(marker), "files": files}


def test_a_redo_killed_at_any_point_leaves_the_old_states_or_the_new_never_a_mix(merged_run, tmp_path):
    hidden = RunPaths.of(merged_run).hidden_dir
    old_config = write_config(merged_run, tmp_path / "old.yaml", shard_tokens=1)
    subprocess.run([sys.executable, "-m", "eyas", "extract", str(old_config), "-q"], env=env(), cwd=ROOT, check=True)
    old = whole(hidden)
    config = write_config(merged_run, tmp_path / "new.yaml", shard_tokens=1, aux_layers=[2, 10, 20])
    redo = hidden.with_name("hidden.redo")
    kill_points = [
        lambda: redo.is_dir(),
        lambda: (redo / "shard-00001.json").exists(),
        lambda: (redo / "shard-00004.json").exists(),
        lambda: (redo / "index.json").exists(),
    ]
    command = [sys.executable, "-m", "eyas", "extract", str(config), "-q", "--redo"]
    seen = kill_at_each(command, kill_points, lambda: whole(hidden), old, env=env(), cwd=ROOT)
    assert seen[0] == "old", seen
    subprocess.run(
        [sys.executable, "-m", "eyas", "extract", str(config), "-q", "--redo"], env=env(), cwd=ROOT, check=True
    )
    new = whole(hidden)
    assert new["marker"] != old["marker"] and not redo.exists()
    assert HiddenStates(hidden).aux_layers == [2, 10, 20]
