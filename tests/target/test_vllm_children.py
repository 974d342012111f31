"""vLLM children fail loudly, in bounded time, and leave nothing behind.

vLLM is an external service, so these tests point ``target.vllm_python`` at small stand-ins
(:mod:`tests.vllm_stand_ins`) that play its part, badly mostly: exit at once, never answer,
answer one result short, echo what they were sent. eyas's own code runs unchanged; each test
takes a second or two.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from eyas.config import TargetConfig
from eyas.target import cache_root
from eyas.target.children import LAUNCHER
from eyas.target.settings import PrefillCapture, Sampling, SpeculativeDecoding
from eyas.target.vllm import ENV_PYTHON, VllmChild, VllmError, vllm_python
from eyas.target.vllm_engine import VllmGenerator, VllmPrefill, gpu_memory_utilization, speculative_decode
from tests.train.conftest import subprocess_env
from tests.vllm_stand_ins import ANSWERS, EVAL, EXITS, HANGS, HANGS_AFTER_READY, SHORT, stand_in

GIB = 2**30


@pytest.fixture
def temp_dir(tmp_path, monkeypatch) -> Path:
    """The system's temporary folder, here: where the children's settings files (``*.json``) would be left."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def target(python: str, timeout_s: float = 60.0) -> TargetConfig:
    return TargetConfig(model="embedded", device="cpu", vllm_python=python, engine_timeout_s=timeout_s)


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for whoever adopted it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stopped_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def test_a_child_that_exits_at_once_leaves_nothing_behind_and_names_its_log(tmp_path, temp_dir):
    python = stand_in(tmp_path, EXITS)
    log = tmp_path / "vllm.log"
    with pytest.raises(
        VllmError, match=rf"vLLM \(generate\) exited with 3; last lines of {re.escape(str(log))}:\nstand-in: "
    ):
        VllmChild("generate", python, {}, log, 60.0)
    assert list(temp_dir.glob("*.json")) == []

    staging = tmp_path / "hidden" / "vllm-staging"
    staging.parent.mkdir()
    with pytest.raises(VllmError, match=r"vLLM \(extract\) exited with 3; last lines of .*hidden/vllm.log"):
        VllmPrefill(target(python), PrefillCapture("auto"), [1, 14, 25], 30, 8, staging, staging.parent / "vllm.log")
    assert sorted(p.name for p in staging.parent.iterdir()) == ["vllm.log"] and list(temp_dir.glob("*.json")) == []

    out = tmp_path / "eval"
    with pytest.raises(VllmError, match=r"vLLM \(eval, plain decoding \(no drafter\)\) exited with 3; last lines of "):
        speculative_decode(target(python), SpeculativeDecoding(3, 8, 0.0, 0), None, [[1, 2]], {2}, "float32", out)
    assert [p.name for p in out.iterdir()] == ["vllm.log"], "no request file stays behind"


def test_a_child_that_never_answers_is_stopped_with_its_group_after_the_timeout(tmp_path, temp_dir):
    log = tmp_path / "vllm.log"
    started = time.monotonic()
    with pytest.raises(VllmError, match=r"vLLM \(generate\) gave no answer within target.engine_timeout_s = 0.5 s"):
        VllmChild("generate", stand_in(tmp_path, HANGS), {}, log, 0.5)
    assert time.monotonic() - started < 5
    assert stopped_within(int(log.read_text().split()[0]), 5), "the engine it started is stopped too"
    assert list(temp_dir.glob("*.json")) == []

    # Ready, then silent on a request: the same limit holds for every answer.
    with VllmChild("generate", stand_in(tmp_path, HANGS_AFTER_READY), {}, log, 0.5) as child:
        with pytest.raises(VllmError, match=r"target.engine_timeout_s = 0.5 s and was stopped"):
            child.ask({"prompts": [[1]]})
    assert list(temp_dir.glob("*.json")) == []

    out = tmp_path / "eval"
    with pytest.raises(VllmError, match=r"vLLM \(eval\) gave no answer within target.engine_timeout_s = 0.5 s"):
        speculative_decode(
            target(stand_in(tmp_path, HANGS), 0.5), SpeculativeDecoding(3, 8, 0.0, 0), None, [[1]], {2}, "float32", out
        )
    assert stopped_within(int((out / "vllm.log").read_text().split()[0]), 5)
    assert [p.name for p in out.iterdir()] == ["vllm.log"]


def test_a_result_missing_from_an_answer_is_an_error_naming_both_counts(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv(SHORT, "1")
    python = stand_in(tmp_path, ANSWERS)
    sampling = Sampling(max_tokens=4, temperature=0.0, top_p=1.0, seed=0, batch_size=2)
    with VllmGenerator(target(python), sampling, tokenizer, 2, {2}, tmp_path / "vllm.log") as generator:
        with pytest.raises(VllmError, match=r"vLLM \(generate\) returned 1 results for 2 sent"):
            generator.generate_batch([[1, 2], [1, 2, 3]], seed=0)

    decoding = SpeculativeDecoding(3, 8, 0.0, 0)
    with pytest.raises(VllmError, match=r"vLLM \(eval\) returned 1 outputs for 2 prompts"):
        speculative_decode(target(stand_in(tmp_path, EVAL)), decoding, None, [[1], [2]], {2}, "float32", tmp_path)


def test_gpu_memory_utilization_is_vllms_default_on_a_free_device_and_what_is_free_otherwise():
    assert gpu_memory_utilization(141 * GIB, 141 * GIB) == 0.9
    assert gpu_memory_utilization(130 * GIB, 141 * GIB) == 0.9
    assert gpu_memory_utilization(102 * GIB, 141 * GIB) == pytest.approx(100 / 141)
    with pytest.raises(VllmError, match=r"only 1.5 of the GPU's 141.0 GiB are free"):
        gpu_memory_utilization(int(1.5 * GIB), 141 * GIB)


def test_children_get_the_share_of_gpu_memory_free_when_they_start(tmp_path, tokenizer, monkeypatch):
    from eyas.target import vllm_engine

    monkeypatch.setattr(vllm_engine, "device_memory", lambda: (72 * GIB, 80 * GIB))
    share = gpu_memory_utilization(72 * GIB, 80 * GIB)
    assert share == pytest.approx(70 / 80)
    sampling = Sampling(max_tokens=4, temperature=0.0, top_p=1.0, seed=0, batch_size=2)
    log = tmp_path / "vllm.log"
    with VllmGenerator(target(stand_in(tmp_path, ANSWERS)), sampling, tokenizer, 2, {2}, log) as generator:
        assert [c.token_ids for c in generator.generate_batch([[1], [1, 5]], seed=0)] == [[2], [2]]
    assert json.loads(log.read_text().splitlines()[0])["gpu_memory_utilization"] == share

    python, decoding = stand_in(tmp_path, EVAL), SpeculativeDecoding(3, 8, 0.0, 0)
    result = speculative_decode(target(python), decoding, None, [[1], [2]], {2}, "float32", tmp_path / "eval")
    assert result["request"]["gpu_memory_utilization"] == share
    # Measured at each start but not part of the request's identity: the cached result is reused.
    monkeypatch.setattr(vllm_engine, "device_memory", lambda: (40 * GIB, 80 * GIB))
    again = speculative_decode(target(python), decoding, None, [[1], [2]], {2}, "float32", tmp_path / "eval")
    assert again == result and len(list((tmp_path / "eval").glob("vllm-*.json"))) == 1


def test_relative_interpreter_and_cache_paths_are_made_absolute_without_resolving_links(tmp_path, monkeypatch):
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_PYTHON, "venv/bin/python")
    # The link itself: resolving it would leave the virtual environment for its base interpreter.
    assert vllm_python(None) == str(bin_dir / "python")
    assert vllm_python("venv/../venv/bin/python") == str(bin_dir / "python")
    monkeypatch.setenv("EYAS_CACHE", "cache")
    assert cache_root() == tmp_path / "cache"


def test_a_child_dies_with_eyas_even_when_eyas_is_killed(tmp_path):
    """eyas stands in the middle here: SIGKILLed, its vLLM child and that child's own process go too."""
    child = "import eyas_child, subprocess, time; print(subprocess.Popen(['sleep', '600']).pid, flush=True); time.sleep(600)"
    log = tmp_path / "child.log"
    eyas = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from eyas.target.vllm import start_vllm; "
            f"start_vllm([sys.executable, '-c', {child!r}], open({str(log)!r}, 'w')); time.sleep(600)",
        ],
        env=subprocess_env(),
    )
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    engine = int(log.read_text().split()[0])
    group = os.getpgid(engine)
    eyas.send_signal(signal.SIGKILL)
    eyas.wait()
    try:
        assert stopped_within(engine, 10), "the child took its whole group down when eyas died"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def test_a_child_whose_eyas_died_before_it_started_exits_at_once():
    launch = [
        sys.executable,
        str(LAUNCHER),
        sys.executable,
        "-c",
        "import os; assert 'EYAS_PARENT_PID' not in os.environ",
    ]
    env = {**os.environ, "EYAS_PARENT_PID": "1"}
    done = subprocess.run(launch, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "eyas (pid 1) exited before" in done.stderr
    env["EYAS_PARENT_PID"] = str(os.getpid())
    assert subprocess.run(launch, env=env).returncode == 0
