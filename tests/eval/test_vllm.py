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
from eyas.eval import vllm_engine
from tests.conftest import write_jsonl
from tests.train.conftest import subprocess_env

from .overfit import OVERFIT_NEW, TEXTS


def _vllm_or_skip() -> str:
    try:
        return vllm_engine.vllm_python(None)
    except ConfigError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory, overfit):
    _vllm_or_skip()
    root = tmp_path_factory.mktemp("vllmrun")
    overfit[3].save(root / "draft")
    write_jsonl(root / "prompts.jsonl", [{"prompt": t} for t in TEXTS])
    (root / "run.yaml").write_text(
        "run_dir: run\n"
        "target: {model: embedded, device: cpu}\n"
        f"eval: {{num_draft_tokens: 3, max_new_tokens: {OVERFIT_NEW}, prompts: prompts.jsonl, broken_control: false}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "eyas", "eval", str(root / "run.yaml"), "--engine", "vllm", "--draft", str(root / "draft"), "-q"],
        capture_output=True, text=True, env=subprocess_env(), timeout=900,
    )
    return root, done


@pytest.mark.slow
def test_vllm_serves_the_export_with_eyas_tau_passes_and_outputs(vllm_run):
    root, done = vllm_run
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((root / "run" / "eval" / "report.json").read_text())
    eyas, vllm = report["methods"]["eagle3"], report["methods"][vllm_engine.METHOD]
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
def test_a_second_run_reuses_vllms_result(vllm_run):
    """The vLLM result is cached by request: rerunning the same eval does not start vLLM again."""
    root, _ = vllm_run
    cached = list((root / "run" / "eval").glob("vllm-*.json"))
    assert len(cached) == 1
    done = subprocess.run(
        [sys.executable, "-m", "eyas", "eval", str(root / "run.yaml"), "--engine", "vllm", "--draft", str(root / "draft")],
        capture_output=True, text=True, env=subprocess_env(), timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vLLM τ" in done.stderr and ": agree" in done.stderr
    assert "serving" not in done.stderr


def test_a_missing_vllm_is_a_config_error_that_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_engine.ENV_PYTHON, str(tmp_path / "no-python"))
    with pytest.raises(ConfigError, match=r"EYAS_VLLM_PYTHON: .*no-python does not exist"):
        vllm_engine.vllm_python(None)
