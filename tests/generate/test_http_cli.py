"""The real ``eyas`` command against the fake server: exit codes, SIGKILL and resume, providers, plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eyas.generate.http.budget import Ledger
from eyas.generate.http.errors import EXIT_CREDITS_EXHAUSTED
from tests.conftest import write_jsonl
from tests.generate.configs import openai_generate
from tests.generate.fake_openai import FakeOpenAI, FakeServer

EYAS = [sys.executable, "-m", "eyas"]


def write_config(tmp_path: Path, base_url: str, prompts: list[str], **generate) -> Path:
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"p{i}", "prompt": p} for i, p in enumerate(prompts)])
    g = openai_generate(base_url, **({"retry": {"max_attempts": 8}} | generate))
    config = {"run_dir": "run", "datasets": [{"name": "ds", "source": "prompts.jsonl"}], "generate": g}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def eyas(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*EYAS, *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


def records(tmp_path: Path) -> list[dict]:
    path = tmp_path / "run" / "generate" / "ds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_gives_exactly_one_record_per_prompt(tmp_path):
    prompts = [f"kill question {i}" for i in range(48)]
    fake = FakeOpenAI(latency_s=0.15)
    with FakeServer(fake) as server:
        config = write_config(tmp_path, server.base_url, prompts, budget_usd=5.0)
        proc = subprocess.Popen(
            [*EYAS, "generate", str(config), "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        out = tmp_path / "run" / "generate" / "ds.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 12):
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        before = len(records(tmp_path))
        assert 12 <= before < 48

        done = eyas("generate", config, "-q")
        assert done.returncode == 0, done.stderr
        got = records(tmp_path)
        assert sorted(r["prompt_id"] for r in got) == sorted(f"p{i}" for i in range(48))
        assert all(r["content"] == f"answer to: {r['messages'][-1]['content']}" for r in got)
        # Only requests in flight at the kill can have been bought twice, and the ledger knows them.
        assert sum(fake.served.values()) - 48 <= 4
        ledger = Ledger(tmp_path / "run" / "generate" / "ledger.jsonl", None)  # as the next run would open it
        assert ledger.spent == pytest.approx(sum(r["usage"]["cost"] for r in got), abs=1e-3 * 5 * 64 * 4e-6)
        assert fake.charged <= ledger.spent + ledger.possibly_spent + 1e-12


def test_credits_exhausted_exits_3_and_resumes(tmp_path):
    prompts = [f"cli credit question {i}" for i in range(16)]
    fake = FakeOpenAI(latency_s=0.01, credits_usd=0.0003)
    with FakeServer(fake) as server:
        config = write_config(tmp_path, server.base_url, prompts, concurrency=2)
        first = eyas("generate", config, "-q")
        assert first.returncode == EXIT_CREDITS_EXHAUSTED == 3
        assert "no credits left" in first.stderr and "rerun" in first.stderr
        assert 0 < len(records(tmp_path)) < 16
        fake.credits_usd = None
        assert eyas("generate", config, "-q").returncode == 0
        assert len(records(tmp_path)) == 16
        assert set(fake.served.values()) == {1}


def test_budget_reached_exits_4_and_bad_key_exits_5(tmp_path):
    fake = FakeOpenAI(api_key="sk-right")
    with FakeServer(fake) as server:
        config = write_config(
            tmp_path,
            server.base_url,
            [f"q{i}" for i in range(20)],
            budget_usd=0.0004,
            provider_policy={"quantizations": ["int4"]},
        )
        assert eyas("generate", config, "-q", env={**os.environ}).returncode == 5  # no key sent: 401
        (tmp_path / "run").rename(tmp_path / "run-401")
        (tmp_path / "key").write_text("sk-right\n")
        config = write_config(
            tmp_path,
            server.base_url,
            [f"q{i}" for i in range(20)],
            budget_usd=0.0004,
            provider_policy={"quantizations": ["int4"]},
            api_key_file=str(tmp_path / "key"),
        )
        run = eyas("generate", config, "-q")
    assert run.returncode == 4, run.stderr
    assert "budget reached" in run.stderr and "sk-right" not in run.stderr
    assert fake.charged <= 0.0004


def test_bad_config_names_the_key(tmp_path):
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", ["q"], budget_usd=1.0)
    result = eyas("generate", config)
    assert result.returncode == 2
    assert "generate.http.budget_usd is set but no prices are known" in result.stderr
    assert "Traceback" not in result.stderr


def test_providers_lists_endpoints_with_the_policy_verdict(tmp_path):
    fake = FakeOpenAI()
    with FakeServer(fake) as server:
        config = write_config(
            tmp_path, server.base_url, ["q"], provider_policy={"quantizations": ["int4", "fp8"], "ignore": ["precise"]}
        )
        table = eyas("providers", "moonshotai/kimi-k2.5", "--config", config, env={**os.environ, "COLUMNS": "200"})
        as_json = eyas("providers", "moonshotai/kimi-k2.5", "--json", "--base-url", server.base_url)
        missing = eyas("providers", "nobody/nothing", "--base-url", server.base_url)
    assert table.returncode == 0, table.stderr
    text = table.stderr
    for expected in (
        "4 endpoints, 1 allowed",
        "FakeAI",
        "int4",
        "1.000",
        "4.000",
        "allowed",
        "excluded: quantization fp4",
        "excluded: ignored",
    ):
        assert expected in text
    listed = {e["tag"]: e for e in json.loads(as_json.stdout)}
    assert set(listed) == {"fakeai", "cheapo/fp4", "precise", "mystery"}
    assert listed["cheapo/fp4"]["completion_usd_per_m"] == pytest.approx(1.0) and listed["mystery"]["allowed"]
    assert missing.returncode == 2 and "404" in missing.stderr


def test_plan_projects_cost_and_applies_targets_that_fit(tmp_path):
    fake = FakeOpenAI()
    with FakeServer(fake) as server:
        config = write_config(
            tmp_path,
            server.base_url,
            [f"plan question {i}" for i in range(100)],
            budget_usd=0.01,
            max_tokens=1000,
            provider_policy={"quantizations": ["int4"]},
        )
        data = yaml.safe_load(config.read_text())
        data["datasets"][0]["output_token_target"] = 50_000
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        over = eyas("plan", config, env={**os.environ, "COLUMNS": "200"})
        applied = eyas("plan", config, "--apply")
        fits = eyas("plan", config, env={**os.environ, "COLUMNS": "200"})
    assert over.returncode == 0, over.stderr
    # 50,000 output tokens at $4/M = $0.20 plus 50 requests' prompts at $1/M: far over $0.01.
    assert "over budget" in over.stderr and "50,000" in over.stderr and "--apply" in over.stderr
    target = yaml.safe_load(config.read_text())["datasets"][0]["output_token_target"]
    assert 2000 <= target < 2500
    assert (tmp_path / "config.yaml.bak").exists() and "wrote the proposed" in applied.stderr
    assert "fits" in fits.stderr


def test_plan_uses_what_earlier_runs_measured_and_spent(tmp_path):
    from eyas import generate
    from eyas.config import load_config

    fake = FakeOpenAI()
    with FakeServer(fake) as server:
        config = write_config(
            tmp_path,
            server.base_url,
            [f"measured question {i}" for i in range(20)],
            budget_usd=1.0,
            max_tokens=1000,
            prices={"prompt": 1.0, "completion": 4.0},
        )
        generate.run(load_config(config), quiet=True)
        result = eyas("plan", config, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stderr.splitlines() if line.startswith("│ ds"))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    # 20 prompts answered with 8 tokens each ("answer to: measured question N" + 3): measured, not max_tokens.
    assert cells[:7] == ["ds", "20", "6", "8", "-", "160", "20"]  # prompt tokens: 5 or 6 as the fake counts them
    assert f"spent so far ${fake.charged:,.4f}" in result.stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.slow
def test_ctrl_c_saves_finished_work_and_the_rerun_completes(tmp_path):
    prompts = [f"interrupt question {i}" for i in range(40)]
    # Eight answers, then the server holds every request until released: the interrupt lands
    # mid-run however busy the machine is (a loaded machine once finished all 40 before it).
    fake = FakeOpenAI(latency_s=0.05, hold_after=8)
    with FakeServer(fake) as server:
        config = write_config(tmp_path, server.base_url, prompts, concurrency=4)
        # As a terminal would start it: SIGINT handled and unblocked, whatever earlier tests did to
        # this process's signal state (a full suite once left the child deaf to it: exit 0, not 130).
        proc = subprocess.Popen(
            [*EYAS, "generate", str(config), "-q"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records(tmp_path)) < 6:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 130  # typer turns KeyboardInterrupt into a silent exit 130
        assert "Traceback" not in stderr and "internal error" not in stderr
        assert 6 <= len(records(tmp_path)) <= 8
        fake.release.set()
        assert eyas("generate", config, "-q").returncode == 0
    assert sorted(r["prompt_id"] for r in records(tmp_path)) == sorted(f"p{i}" for i in range(40))


def test_plan_counts_every_answer_asked_of_each_prompt(tmp_path):
    """With ``generate.samples_per_prompt`` the plan prices k requests per prompt, not one."""
    from eyas.config import load_config
    from eyas.generate.http.commands import plan_inputs

    config = write_config(tmp_path, "http://127.0.0.1:9/v1", ["a", "b"], temperature=0.7, samples_per_prompt=3)
    (inputs,) = plan_inputs(load_config(config))
    assert inputs.prompts == 6
