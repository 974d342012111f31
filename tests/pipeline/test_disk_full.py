"""A full disk, for real: a run directory on a small tmpfs. ``eyas run`` refuses what will not fit
before generating; an extraction that finds its disk filled from outside stops at a shard
boundary, and once the disk is grown it resumes to the shards an uninterrupted run writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from eyas import extract, pipeline
from eyas.config import load_config
from eyas.extract import storage
from eyas.paths import RunPaths
from eyas.space import EXIT_CODE
from tests.conftest import ROOT, write_jsonl
from tests.disks import fill_once, grow, small_disk

pytestmark = pytest.mark.slow
PROMPTS = ["Name a fruit.", "What is 3+3?", "Say hello.", "Name a color.", "What day follows Monday?", "Name a pet."]


def _config(root, **extract_settings):
    write_jsonl(root / "p.jsonl", [{"prompt": p} for p in PROMPTS])
    data = {
        "run_dir": "run",
        "target": {"model": "embedded", "device": "cpu"},
        "datasets": [{"name": "tiny", "source": "p.jsonl"}],
        "generate": {"max_tokens": 12, "batch_size": 6},
        "merge": {"eval_count": 1},
        "extract": extract_settings,
    }
    (root / "run.yaml").write_text(yaml.safe_dump(data))
    return root / "run.yaml"


def _eyas(*args, **env):
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "COLUMNS": "400", **env}
    return [sys.executable, "-m", "eyas", *args], environment


def test_a_run_whose_states_will_not_fit_stops_before_generating_with_the_levers(tmp_path):
    with small_disk(tmp_path / "disk", "512K") as disk:
        command, env = _eyas("run", str(_config(disk)))
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=disk)
        assert done.returncode == EXIT_CODE, done.stderr
        said = " ".join((done.stdout + done.stderr).split())
        assert "free on its disk" in said and "extract: hidden states of about" in said
        assert "extract.dtype: fp8" in said and "extract.mode: online" in said
        assert not (disk / "run" / "generate").exists(), "nothing was generated"


def test_an_extraction_that_fills_its_disk_stops_at_a_shard_and_resumes_to_the_same_shards(tmp_path):
    with small_disk(tmp_path / "disk", "8M") as disk:
        config_path = _config(disk, shard_tokens=1)  # one sample per shard
        config = load_config(config_path)
        pipeline.run(config, quiet=True, last="merge")
        straight = tmp_path / "straight"
        shutil.copytree(disk, straight, ignore=shutil.ignore_patterns("lost+found"))
        hidden = RunPaths.of(config).hidden_dir

        command, env = _eyas("extract", str(config_path), "-q")
        proc = subprocess.Popen(command, env=env, cwd=disk, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ballast = fill_once(proc, (hidden / "shard-00000.json").exists, disk)
        said = " ".join(proc.communicate(timeout=600)[0].split())
        assert proc.returncode == EXIT_CODE, said
        assert "the disk is full writing" in said and "nothing committed was lost" in said
        done = sorted(hidden.glob("shard-*.json"))
        assert 1 <= len(done) < 5, "stopped at a shard boundary, before the end"
        for sidecar in done:
            meta = json.loads(sidecar.read_text())
            assert storage.file_sha256(hidden / meta["file"]) == meta["sha256"], "a committed shard is whole"
        assert sorted(p.name for p in hidden.glob("shard-*.safetensors")) == [
            p.with_suffix(".safetensors").name for p in done
        ]
        assert not list(hidden.glob("*.tmp-*")) and not (hidden / "index.json").exists()

        grow(disk, "32M")
        resumed = subprocess.run(command, env=env, cwd=disk, capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        ballast.unlink()

        extract.run(load_config(straight / "run.yaml"), quiet=True)
        mine, theirs = sorted(hidden.glob("shard-*.safetensors")), sorted((straight / "run" / "hidden").glob("shard-*"))
        theirs = [p for p in theirs if p.suffix == ".safetensors"]
        assert [p.name for p in mine] == [p.name for p in theirs] and len(mine) == 5
        for a, b in zip(mine, theirs):
            assert storage.file_sha256(a) == storage.file_sha256(b), f"{a.name}: the same samples and states"
