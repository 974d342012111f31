"""``eyas tune`` on the embedded target in a real llama-server: the race, the command it writes,
a planted difference failing its cell, and measurements never reused by another thread count."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from eyas.config import load_config
from tests.conftest import ROOT
from tests.eval.conftest import overfit  # noqa: F401  (the session's overfit drafter)
from tests.eval.overfit import engine_eval_config
from tests.kills import kill_engine_child

pytestmark = pytest.mark.slow

TUNE = (
    "tune: {max_prompts: 3, max_new_tokens: 16, max_draft_tokens: 2, p_min: [0.5], threads: [THREADS], "
    "in_flight: [2], min_rounds: 2, max_rounds: 2, draft_types: [f32, q8_0]}\n"
)


def _config(tmp_path, drafter, threads: int):
    path = engine_eval_config(tmp_path, drafter, "engine: llamacpp")
    path.write_text(path.read_text() + TUNE.replace("THREADS", str(threads)))
    return load_config(path)


def test_tune_races_the_settings_and_a_planted_difference_fails_its_cell(overfit, tmp_path):  # noqa: F811
    from eyas import tune

    report = tune.run(_config(tmp_path, overfit[3], 2), quiet=True)
    assert [p["name"] for p in report["phases"]] == ["coarse", "refine", "load"]
    cells = report["cells"]
    coarse = {"plain t=2 np=1", "ngram-mod t=2 np=1", "ngram-simple t=2 np=1", "draft n=2 p-min=0.5 gguf=f32 t=2 np=1"}
    assert coarse <= set(cells)
    assert "draft n=1 p-min=0.65 gguf=f32 t=2 np=1" in cells, "the refinement looks p_min_step either side of the best"
    assert any("gguf=q8_0" in key for key in cells), "the refinement serves the best setting in the other GGUF type"
    assert any(key.endswith("np=2") for key in cells), "the drafter is measured with 2 requests in flight"
    for key, c in cells.items():
        assert not c["lossless"]["mismatched"] and c["lossless"]["checked"] >= 3, key
        assert c["low"] <= c["speedup"] <= c["high"]
    assert cells["plain t=2 np=1"]["speedup"] == pytest.approx(1.0)
    assert report["best"].startswith("draft ") and report["verdict"]
    if report["command"]:
        assert re.search(r" -t 2 -md \S+\.gguf --spec-type draft-eagle3 --spec-draft-n-max \d", report["command"])
    assert (tmp_path / "run" / "tune" / "speedup.png").is_file()

    rounds_file = tmp_path / "run" / "tune" / report["rounds_file"]
    rounds = [json.loads(line) for line in rounds_file.read_text().splitlines()]
    assert tune.run(_config(tmp_path, overfit[3], 2), quiet=True)["cells"] == cells, "a rerun replays, measures nothing"

    # Plant one wrong token in the best setting's first output of the refinement's last round.
    best = report["best"]
    last_refine = max(i for i, r in enumerate(rounds) if r["phase"] == "refine")
    outputs = rounds[last_refine]["cells"][best]["outputs"]
    prompt = sorted(outputs)[0]
    outputs[prompt][0] += 1
    rounds_file.write_text("".join(json.dumps(r) + "\n" for r in rounds))
    again = tune.run(_config(tmp_path, overfit[3], 2), quiet=True)
    assert again["cells"][best]["lossless"]["mismatched"] == [prompt]
    assert again["best"] not in (best, None), "a setting whose output differs is never recommended"


def test_tune_on_the_shipped_quantized_target_races_the_drafters_gguf_types_losslessly(overfit, tmp_path):  # noqa: F811
    """Almost every llama.cpp user serves a quantized target; tune measured only the converted f32
    file, and with the drafter in the target's precision only. On the shipped Q4_1, each GGUF type
    of the drafter is checked against plain decoding of that same Q4_1 file."""
    from eyas import tune
    from eyas.target import embedded_gguf

    config = _config(tmp_path, overfit[3], 2)
    lean = {"in_flight": [], "max_draft_tokens": 1, "p_min": [0.0], "target_gguf": "shipped"}
    config = config.model_copy(update={"tune": config.tune.model_copy(update=lean)})
    report = tune.run(config, quiet=True)
    assert report["target"] == str(embedded_gguf())
    assert set(report["drafts"]) == {"f32", "q8_0"} and report["drafts"]["q8_0"].endswith("-q8_0.gguf")
    drafted = {key for key in report["cells"] if key.startswith("draft ")}
    assert drafted == {"draft n=1 p-min=0 gguf=f32 t=2 np=1", "draft n=1 p-min=0 gguf=q8_0 t=2 np=1"}
    for key, c in report["cells"].items():
        assert not c["lossless"]["mismatched"] and c["lossless"]["checked"] >= 3, key
    log = (tmp_path / "run" / "tune" / "llama-server-draft-n1-p-min0-ggufq8_0-t2-np1.log").read_text()
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in log and "-q8_0.gguf" in log
    if report["command"]:
        gguf = report["best"].split("gguf=")[1].split(" ")[0]
        assert f"-m {embedded_gguf()} " in report["command"] and report["drafts"][gguf] in report["command"]


def test_tune_never_reads_back_what_another_thread_count_measured(overfit, tmp_path):  # noqa: F811
    from eyas import tune

    config = _config(tmp_path, overfit[3], 2)
    lean = {"in_flight": [], "max_draft_tokens": 1, "p_min": [0.0], "max_prompts": 1}
    config = config.model_copy(update={"tune": config.tune.model_copy(update=lean)})
    first = tune.run(config, quiet=True)
    one_thread = config.model_copy(update={"tune": config.tune.model_copy(update={"threads": [1]})})
    second = tune.run(one_thread, quiet=True)
    assert second["rounds_file"] != first["rounds_file"] and second["measured_by"]["threads"] == [1]
    assert all(key.split(" t=")[1].startswith("1 ") for key in second["cells"])
    log = (tmp_path / "run" / "tune" / "llama-server-plain-t1-np1.log").read_text()
    assert "n_threads = 1" in log


def test_a_llama_server_killed_mid_tune_names_its_log_and_the_rerun_keeps_the_recorded_rounds(overfit, tmp_path):  # noqa: F811
    """Only a SIGKILL of eyas itself was tested: an engine child dying mid-stage must stop the stage
    with its log named, and the rounds measured before it must survive for the rerun."""
    _config(tmp_path, overfit[3], 2)  # writes run.yaml
    lean = {"in_flight": [], "max_draft_tokens": 1, "p_min": [0.0], "max_prompts": 1, "min_rounds": 3, "max_rounds": 3}
    data = yaml.safe_load((tmp_path / "run.yaml").read_text())
    data["tune"] |= lean
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "400"}
    command = [sys.executable, "-m", "eyas", "tune", str(tmp_path / "run.yaml"), "-q"]
    tune_dir = tmp_path / "run" / "tune"
    rounds = lambda: [line for f in tune_dir.glob("rounds-*.jsonl") for line in f.read_text().splitlines()]  # noqa: E731
    killed, returncode, said = kill_engine_child(command, lambda: bool(rounds()), env=env, cwd=tmp_path)
    assert killed is not None, "the kill must land while a later round runs"
    assert returncode == 1 and re.search(r"llama-server \S+ .*last lines of \S+llama-server-\S+\.log", said), said
    recorded = rounds()
    assert recorded, "the rounds measured before the kill survive"

    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rounds()[: len(recorded)] == recorded, "the rerun replays them and measures only what was lost"
