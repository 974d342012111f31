"""``eyas eval --engine vllm``: the export served by vLLM itself agrees with eyas's own eval.

Runs where vLLM is installed (``make test`` builds ``.venv-vllm`` for it; elsewhere these
tests are skipped, saying why). vLLM's CPU build takes about a minute to start.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eyas.config import ConfigError
from eyas.drafter.families import save_drafter
from eyas.eval import vllm_engine
from eyas.eval.families import VLLM_BASIS, compare
from eyas.target.vllm import ENV_PYTHON, vllm_python
from tests.conftest import vllm_or_skip, write_jsonl
from tests.kills import kill_engine_child
from tests.servers import served
from tests.train.conftest import subprocess_env
from tests.vllm_stand_ins import EVAL, stand_in

from .overfit import OVERFIT_NEW, TEXTS, engine_eval_config, overfit_drafter


def eyas_eval(*args) -> subprocess.CompletedProcess:
    """``eyas eval`` as a user runs it; vLLM's CPU build takes about a minute to start."""
    return subprocess.run(
        [sys.executable, "-m", "eyas", "eval", *map(str, args)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=900,
    )


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory, model, overfit):
    """``eyas eval`` with vLLM of an EAGLE-3.1 drafter as vLLM defines it (``fc_norm``,
    ``norm_output``), first with its vLLM child killed mid-run, then rerun: (root, the rerun, (the
    killed run's exit code and words, eyas's own results it had finished)). The README test
    serves EAGLE-3 as published."""
    vllm_or_skip()
    prompts, greedy, _, _ = overfit
    drafter = overfit_drafter(
        model, [p + g for p, g in zip(prompts, greedy)], eagle3={"fc_norm": True, "norm_output": True}
    )
    root = tmp_path_factory.mktemp("vllmrun")
    config = engine_eval_config(root, drafter, "engine: vllm")
    command = [sys.executable, "-m", "eyas", "eval", str(config), "-q"]
    env = subprocess_env() | {"COLUMNS": "400"}
    killed, returncode, said = kill_engine_child(command, lambda: True, name=b"eval_child.py", env=env)
    assert killed is not None, "the kill must land while vLLM decodes"
    finished = {p: p.stat().st_mtime_ns for p in (root / "run" / "eval").glob("results-*.jsonl")}
    return root, eyas_eval(config, "-q"), (returncode, said, finished)


@pytest.mark.slow
def test_a_vllm_child_killed_mid_eval_names_its_log_and_the_rerun_decodes_nothing_eyas_had(vllm_run):
    """Exit 1 naming the child's log; eyas's own per-prompt results, finished before vLLM
    started, are kept, and the rerun only runs vLLM again."""
    root, done, (returncode, said, finished) = vllm_run
    assert returncode == 1, said
    assert "error: vLLM (eval, " in said and "exited with" in said and str(root / "run" / "eval" / "vllm.log") in said
    assert finished, "eyas's own decoding of every prompt finished first"
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p: p.stat().st_mtime_ns for p in finished} == finished, "the rerun decodes nothing eyas had decoded"


@pytest.mark.slow
def test_vllm_serves_the_export_with_eyas_tau_passes_and_outputs(vllm_run):
    root, done, _ = vllm_run
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((root / "run" / "eval" / "report.json").read_text())
    eyas, vllm = report["methods"]["eagle3"], report["methods"][vllm_engine.method_name("eagle3")]
    check = report["engine_check"]
    assert check["checked"] and check["problems"] == []
    # Identical greedy outputs on every prompt, the same verification passes, τ within the stated bound.
    assert vllm["lossless"] == {"checked": len(TEXTS), "identical": len(TEXTS), "mismatched": []}
    assert vllm["target_passes"] == eyas["target_passes"]
    low, high = check["allowed"]
    assert low <= vllm["tau"] - eyas["tau"] <= high
    assert vllm["tau"] > 1.5, "the overfit drafter is accepted in vLLM too"
    assert len(vllm["per_position"]) == 3 and vllm["per_position"][0] > 0
    assert vllm["engine"].startswith("vllm ")


@pytest.mark.slow
def test_vllm_serves_a_dflash_export_with_eyas_tau_passes_and_outputs(tmp_path, overfit_dflash_drafter):
    """Issue 20: vLLM's CPU build runs its DFlash proposer (method ``dflash``) on the export as eyas
    writes it, and its counters agree with eyas's own DFlash eval."""
    vllm_or_skip()
    done = eyas_eval(engine_eval_config(tmp_path, overfit_dflash_drafter, "engine: vllm"), "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    eyas, vllm = report["methods"]["dflash"], report["methods"][vllm_engine.method_name("dflash")]
    assert report["engine_check"]["checked"] and report["engine_check"]["problems"] == []
    assert vllm["lossless"] == {"checked": len(TEXTS), "identical": len(TEXTS), "mismatched": []}
    assert vllm["target_passes"] == eyas["target_passes"] and vllm["tau"] > 1.5


@pytest.mark.slow
def test_a_second_run_reuses_vllms_result(vllm_run):
    """The vLLM result is cached by request: rerunning the same eval does not start vLLM again."""
    root, _, _ = vllm_run
    cached = list((root / "run" / "eval").glob("vllm-*.json"))
    assert len(cached) == 1
    done = eyas_eval(root / "run.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vLLM τ" in done.stderr and ": agree" in done.stderr
    assert "in vLLM" not in done.stderr


@pytest.mark.slow
def test_with_the_target_not_loaded_here_vllm_alone_measures_tau(vllm_run, tmp_path):
    """``eval.in_process: false`` (a target larger than one device): vLLM's plain decoding is the baseline and reference."""
    import shutil

    root, _, _ = vllm_run
    eval_dir = tmp_path / "run" / "eval"
    eval_dir.mkdir(parents=True)
    for cached in (root / "run" / "eval").glob("vllm-*.json"):  # the drafter's run: only plain decoding starts vLLM
        shutil.copy(cached, eval_dir)
    shutil.copy(root / "prompts.jsonl", tmp_path)
    (tmp_path / "run.yaml").write_text(
        "run_dir: run\n"
        "target: {model: embedded, device: cpu}\n"
        f"eval: {{engine: vllm, in_process: false, num_draft_tokens: 3, max_new_tokens: {OVERFIT_NEW}, "
        f"prompts: prompts.jsonl, draft: {root / 'draft'}}}\n"
    )
    done = eyas_eval(tmp_path / "run.yaml", "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((eval_dir / "report.json").read_text())
    assert list(report["methods"]) == [vllm_engine.method_name("eagle3")] and report["plain"]["engine"].startswith(
        "vllm "
    )
    vllm = report["methods"][vllm_engine.method_name("eagle3")]
    # vLLM's plain greedy outputs are the reference, and the drafter's equal them on every prompt.
    assert vllm["lossless"] == {"checked": len(TEXTS), "identical": len(TEXTS), "mismatched": []}
    assert vllm["speedup"] > 0 and vllm["tau"] > 1.5
    assert not list(eval_dir.glob("results-*.jsonl")), "eyas's own in-process eval never ran"
    with_eyas = json.loads((root / "run" / "eval" / "report.json").read_text())
    assert vllm["tau"] == with_eyas["methods"][vllm_engine.method_name("eagle3")]["tau"]
    # A run of several families compares vLLM-only reports by vLLM's own speed-up.
    compared = compare({"eagle3": report})
    row = compared["families"]["eagle3"]
    assert compared["basis"] == VLLM_BASIS
    assert (row["tau"], row["speedup"], row["lossless"]) == (vllm["tau"], vllm["speedup"], True)


@pytest.mark.slow
def test_eyas_releases_the_target_before_vllm_starts_and_tells_vllm_the_free_share(tmp_path, overfit, monkeypatch):
    """After eyas's own eval the target it loaded is gone by the time vLLM's share of the device is
    measured, and the eval child is told that share (the memory query is stubbed: no GPU here)."""
    import weakref

    import eyas.target
    from eyas import eval as stage
    from eyas.config import load_config
    from eyas.target import vllm_engine as target_vllm

    loaded, load_model = [], eyas.target.load_model

    def load_and_watch(*args, **kwargs):
        model = load_model(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    def device_memory():
        assert len(loaded) == 1 and loaded[0]() is None, "eyas still holds the target as vLLM starts"
        return 60 * 2**30, 80 * 2**30

    monkeypatch.setattr(eyas.target, "load_model", load_and_watch)
    monkeypatch.setattr(target_vllm, "device_memory", device_memory)
    save_drafter(overfit[3], tmp_path / "draft")
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": TEXTS[0]}])
    (tmp_path / "run.yaml").write_text(
        "run_dir: run\n"
        f"target: {{model: embedded, device: cpu, vllm_python: {stand_in(tmp_path, EVAL)}}}\n"
        f"eval: {{engine: vllm, num_draft_tokens: 3, max_new_tokens: {OVERFIT_NEW}, prompts: prompts.jsonl, "
        "draft: draft, broken_control: false}\n"
    )
    stage.run(load_config(tmp_path / "run.yaml"), quiet=True)
    [result] = (tmp_path / "run" / "eval").glob("vllm-*.json")
    share = json.loads(result.read_text())["request"]["gpu_memory_utilization"]
    assert share == target_vllm.gpu_memory_utilization(60 * 2**30, 80 * 2**30)


def test_vllm_is_asked_for_no_more_draft_tokens_than_a_dflash_drafter_drafts(tmp_path, model):
    """Asked for 5, a DFlash drafter of block size 4 drafts 3 a pass: vLLM is asked for 3 (a stand-in
    echoes what it was asked), and the row keeps a column for every position asked for."""
    from eyas import eval as stage
    from eyas.config import TrainConfig, load_config
    from eyas.drafter.families.dflash import DFlashDrafter, dflash_spec
    from eyas.drafter.spec import spec_for_target
    from eyas.target.capture import default_aux_layers, num_decoder_layers

    train = TrainConfig(dflash={"block_size": 4})
    base = spec_for_target(model.config, train, default_aux_layers(num_decoder_layers(model)), model.config.vocab_size)
    spec = dflash_spec(base, train.dflash, 16)
    save_drafter(DFlashDrafter(spec, model.get_input_embeddings().weight, model.lm_head.weight), tmp_path / "draft")
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": TEXTS[0]}])
    (tmp_path / "run.yaml").write_text(
        "run_dir: run\n"
        f"target: {{model: embedded, device: cpu, vllm_python: {stand_in(tmp_path, EVAL)}}}\n"
        f"eval: {{engine: vllm, in_process: false, num_draft_tokens: 5, max_new_tokens: {OVERFIT_NEW},"
        " prompts: prompts.jsonl, draft: draft}\n"
    )
    report = stage.run(load_config(tmp_path / "run.yaml"), quiet=True)
    requests = [json.loads(r.read_text())["request"] for r in (tmp_path / "run" / "eval").glob("vllm-*.json")]
    assert {r["method"]: r["num_speculative_tokens"] for r in requests if r["method"]} == {"dflash": 3}
    assert len(report["methods"]["dflash (vllm)"]["per_position"]) == 5


def test_in_process_false_needs_vllm_to_run_the_target(tmp_path):
    from eyas.config import parse_config

    with pytest.raises(ConfigError, match="in_process: false needs engine 'vllm'"):
        parse_config({"run_dir": str(tmp_path), "eval": {"in_process": False}})


def test_a_missing_vllm_is_a_config_error_that_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_PYTHON, str(tmp_path / "no-python"))
    with pytest.raises(ConfigError, match=r"EYAS_VLLM_PYTHON: .*no-python does not exist"):
        vllm_python(None)


def _readme_vllm_command(readme: str) -> str:
    """The vLLM serve command of an export's README, joined from its continuation lines."""
    block = readme.split("## vLLM", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", " ").strip()


@pytest.mark.slow
def test_the_export_readme_serve_command_runs_as_written(tmp_path, overfit, model):
    """The vLLM command an export's README prints starts a server that drafts with the export."""
    import os
    import time
    import urllib.request

    import eyas.export
    from tests.train.conftest import load_tiny

    python = vllm_or_skip()
    run_dir = tmp_path / "run"
    save_drafter(overfit[3], run_dir / "train" / "final")
    out = eyas.export.export_one(load_tiny(run_dir), "vllm")
    command = _readme_vllm_command((out / "README.md").read_text())
    assert command.startswith("python -m vllm.entrypoints.openai.api_server --model ")
    # As written, with `python` being the interpreter that has vLLM, on a free loopback port.
    env = {**os.environ, "PATH": f"{os.path.dirname(python)}:{os.environ['PATH']}", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with served(command, env) as base:
        # ignore_eos (a vLLM extension): 16 tokens, so there are rounds to draft in whatever the answer.
        body = json.dumps(
            {
                "model": _served_model(base),
                "prompt": "The capital of France is",
                "max_tokens": 16,
                "temperature": 0,
                "ignore_eos": True,
            }
        )
        request = urllib.request.Request(f"{base}/v1/completions", body.encode(), {"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
        assert answer["usage"]["completion_tokens"] == 16
        # The server publishes its counters on its stats interval, a few seconds after the request.
        deadline = time.monotonic() + 60
        while _drafts(base) == 0 and time.monotonic() < deadline:
            time.sleep(2)
        assert _drafts(base) > 0, "the server did not draft with the export"


def _served_model(base: str) -> str:
    import urllib.request

    return json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=10).read())["data"][0]["id"]


def _drafts(base: str) -> float:
    import urllib.request

    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    lines = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total")]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


@pytest.mark.parametrize("family", ["dspark", "dflash2"])
def test_a_gpu_only_drafter_is_refused_before_vllm_starts_where_there_is_no_gpu(tmp_path, model, family):
    """vLLM drafts with DSpark and DFlash2 in its GPU model runner only: on a CPU machine eyas says
    so, and names the engine that serves it here, instead of loading the target for vLLM to refuse."""
    from eyas import eval as stage
    from eyas.config import ConfigError, load_config
    from tests.train.test_dflash2 import random_dflash2
    from tests.train.test_dspark import random_dspark

    drafter = random_dspark(model) if family == "dspark" else random_dflash2(model)
    config = engine_eval_config(tmp_path, drafter, "engine: vllm")
    with pytest.raises(ConfigError, match=r"GPU model runner only.*--engine llamacpp"):
        stage.run(load_config(config), quiet=True)
