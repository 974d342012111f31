"""The local backend on the real embedded model: schema, true token ids, resume, crash safety."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from eyas import generate
from eyas.config import load_config
from eyas.generate.status import collect
from eyas.generate.store import read_records
from eyas.paths import RunPaths
from eyas.space import EXIT_CODE
from eyas.stage import read_marker
from tests.conftest import ROOT, write_jsonl
from tests.disks import fill_once, grow, small_disk

QUESTIONS = [
    "What is 2+2?",
    "Name a color.",
    "Say hello.",
    "What is the capital of France?",
    "Count to three.",
    "Name a fruit.",
    "Name a planet.",
    "What is 5+5?",
    "Say goodbye.",
    "Name an animal.",
    "What comes after Tuesday?",
    "Name a tree.",
]


def make_config(tmp_path, n=3, **generate_settings):
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": q} for q in QUESTIONS[:n]])
    settings = {"backend": "local", "max_tokens": 12, "batch_size": 2, **generate_settings}
    data = {
        "run_dir": "run",
        "target": {"model": "embedded", "device": "cpu"},
        "datasets": [{"name": "qa", "source": "prompts.jsonl"}],
        "generate": settings,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_records_hold_true_token_ids_that_decode_to_content(tmp_path, tokenizer):
    config = load_config(make_config(tmp_path, max_tokens=48))
    generate.run(config, quiet=True)
    records = list(read_records(RunPaths.of(config).generations("qa")))
    assert len(records) == 3
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reasons = set()
    for r in records:
        assert r.id == f"qa/{r.prompt_id}" and r.provider == "local" and r.usage.cost == 0.0
        assert r.usage.completion_tokens == len(r.token_ids)
        body = r.token_ids[:-1] if r.finish_reason == "stop" else r.token_ids
        assert (r.token_ids[-1] == end) == (r.finish_reason == "stop")
        assert tokenizer.decode(body, skip_special_tokens=False) == r.content
        prompt_ids = tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False)
        assert r.usage.prompt_tokens == len(tokenizer.encode(prompt_ids, add_special_tokens=False))
        reasons.add(r.finish_reason)
    assert "stop" in reasons  # short factual answers end their turn within 48 tokens

    before = RunPaths.of(config).generations("qa").read_bytes()
    generate.run(config, quiet=True)
    assert RunPaths.of(config).generations("qa").read_bytes() == before

    (status,) = collect(config)
    assert (status.prompts, status.done) == (3, 3)
    assert status.completion_tokens == sum(r.usage.completion_tokens for r in records)


def test_batched_greedy_matches_one_at_a_time(tmp_path):
    a = load_config(make_config(tmp_path / "a", batch_size=3))
    b = load_config(make_config(tmp_path / "b", batch_size=1))
    generate.run(a, quiet=True)
    generate.run(b, quiet=True)

    def ids(c):
        return {r.id: r.token_ids for r in read_records(RunPaths.of(c).generations("qa"))}

    assert ids(a) == ids(b)


@pytest.mark.slow
def test_killed_run_restarts_with_exactly_one_record_per_prompt(tmp_path):
    config_path = make_config(tmp_path, n=6, batch_size=1, max_tokens=16)
    out = RunPaths.of(load_config(config_path)).generations("qa")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "eyas", "generate", str(config_path), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = out.read_text().count("\n")
    assert 2 <= written < 6, "the kill must land mid-run"

    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    ids = [r.id for r in read_records(out)]
    assert len(ids) == 6 and len(set(ids)) == 6


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_stops_at_a_record_and_resumes_to_an_uninterrupted_runs_records(tmp_path):
    """A real full disk (a tmpfs filled from outside after the first record): exit 7 naming the
    file, every committed record whole, and once the disk is grown the same command writes the
    records an uninterrupted run writes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "400"}

    def command(config_path):
        return [sys.executable, "-m", "eyas", "generate", str(config_path), "--quiet"]

    def answers(config_path):
        return {r.id: r.token_ids for r in read_records(RunPaths.of(load_config(config_path)).generations("qa"))}

    # Twelve records of about 500 bytes: more than the free end of the page the first one is on
    # (a tmpfs page, up to 4 KB, which a filled disk still lets the file use).
    straight = make_config(tmp_path / "straight", n=12, batch_size=1, max_tokens=16)
    assert subprocess.run(command(straight), env=env, capture_output=True).returncode == 0
    with small_disk(tmp_path / "disk", "1M") as disk:
        config_path = make_config(disk, n=12, batch_size=1, max_tokens=16)
        out = RunPaths.of(load_config(config_path)).generations("qa")
        proc = subprocess.Popen(
            command(config_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ballast = fill_once(proc, lambda: out.is_file() and out.read_bytes().endswith(b"\n"), disk)
        said = " ".join(proc.communicate(timeout=600)[0].split())
        assert proc.returncode == EXIT_CODE, said
        assert "the disk is full writing" in said and "qa.jsonl" in said and "nothing committed was lost" in said, said
        kept = out.read_bytes()
        assert kept.endswith(b"\n") and 1 <= kept.count(b"\n") < 12, "stopped at a record boundary, mid-run"
        assert all(json.loads(line) for line in kept.splitlines()), "every committed record is whole"

        grow(disk, "4M")
        ballast.unlink()
        resumed = subprocess.run(command(config_path), env=env, capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert out.read_bytes().startswith(kept), "the committed records are as they were"
        assert answers(config_path) == answers(straight)


def test_other_sampling_settings_exit_6_and_redo_sets_the_old_records_aside(tmp_path):
    """Records made under other sampling settings were refused as a bad config (exit 2), where
    the run directory is what is not ready (exit 6); nothing offered to start over."""
    config_path = make_config(tmp_path, n=2, max_tokens=4)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "300"}
    cmd = [sys.executable, "-m", "eyas", "generate", str(config_path), "--quiet"]
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    paths = RunPaths.of(load_config(config_path))
    before = paths.generations("qa").read_text()

    make_config(tmp_path, n=2, max_tokens=5)
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert refused.returncode == 6, refused.stderr
    assert "generate.max_tokens: 4 -> 5" in refused.stderr and "eyas generate CONFIG --redo" in refused.stderr
    assert paths.generations("qa").read_text() == before

    assert subprocess.run([*cmd, "--redo"], env=env, capture_output=True).returncode == 0
    (aside,) = paths.generate_dir.glob("superseded-*")
    assert (aside / "qa.jsonl").read_text() == before and (aside / "settings.json").is_file()
    assert len(list(read_records(paths.generations("qa")))) == 2
    assert read_marker(paths.marker("generate"))["fingerprint"]["generate.max_tokens"] == 5


def test_a_rerun_that_finds_nothing_to_do_keeps_what_the_records_cost(tmp_path):
    """Scaling prices a sample from generate's marker: a no-op rerun rewrote its clock, and local
    generation then cost about nothing per sample."""
    from eyas.stage import spent

    config = load_config(make_config(tmp_path, n=2, max_tokens=4))
    generate.run(config, quiet=True)
    marker = RunPaths.of(config).marker("generate")
    first = spent(read_marker(marker))
    generate.run(config, quiet=True)
    again = read_marker(marker)["run"]
    assert again["total_seconds"] >= first[0] > again["seconds"]
    assert again["total_cpu_seconds"] >= first[1]


def test_a_hub_target_whose_branch_moved_is_not_mixed_with_its_earlier_answers(tmp_path, tokenizer):
    """A hub target's revision was recorded only when named: ``main`` could move between two
    runs, and the second run's answers joined the first's as if one model had written both. The
    commit it resolved to is recorded now (offline here, from the cache's ``refs/main``, as
    huggingface_hub resolves it)."""
    import shutil

    from tests.tiny_targets import build_target

    repo = tmp_path / "hub" / "models--eyas-test--tiny"
    first, second = "1" * 40, "2" * 40
    build_target("Llama", tokenizer, repo / "snapshots" / first)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(first)
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": q} for q in QUESTIONS[:1]])
    data = {
        "run_dir": "run",
        "target": {"model": "eyas-test/tiny", "device": "cpu"},
        "datasets": [{"name": "qa", "source": "prompts.jsonl"}],
        "generate": {"backend": "local", "max_tokens": 2},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "eyas", "generate", str(tmp_path / "run.yaml"), "--quiet"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    settings = tmp_path / "run" / "generate" / "settings.json"
    assert json.loads(settings.read_text())["commit"] == first

    shutil.copytree(repo / "snapshots" / first, repo / "snapshots" / second)
    (repo / "refs" / "main").write_text(second)
    moved = subprocess.run(cmd, env={**env, "COLUMNS": "400"}, capture_output=True, text=True, cwd=tmp_path)
    assert moved.returncode == 6, moved.stderr
    assert f"target.revision (the commit it resolved to): '{first}' -> '{second}'" in moved.stderr
    assert len(list(read_records(tmp_path / "run" / "generate" / "qa.jsonl"))) == 1

    # Records from before the commit was recorded are taken as made with today's, which is then recorded.
    recorded = json.loads(settings.read_text())
    settings.write_text(json.dumps({k: v for k, v in recorded.items() if k != "commit"}))
    assert subprocess.run(cmd, env=env, capture_output=True, cwd=tmp_path).returncode == 0
    assert json.loads(settings.read_text())["commit"] == second


def test_several_answers_per_prompt_are_distinct_records_kept_when_the_count_changes(tmp_path):
    """``generate.samples_per_prompt``: k sampled answers to each prompt, each its own record
    (the first keeps the prompt's id); raising k makes only the new ones, lowering it sets the
    extra ones aside, and raising it again takes them back instead of paying for them twice."""
    config = load_config(make_config(tmp_path, n=2, max_tokens=12, temperature=1.0, samples_per_prompt=2))
    path = RunPaths.of(config).generations("qa")
    generate.run(config, quiet=True)
    records = {r.id: r for r in read_records(path)}
    firsts = [i for i in records if "~" not in i]
    assert len(firsts) == 2 and set(records) == {*firsts, *(f"{i}~1" for i in firsts)}
    assert all(records[f"{i}~1"].messages == records[i].messages for i in firsts)
    assert any(records[f"{i}~1"].token_ids != records[i].token_ids for i in firsts), "samples of one prompt differ"
    assert read_marker(RunPaths.of(config).marker("generate"))["fingerprint"]["generate.samples_per_prompt"] == 2
    (status,) = collect(config)
    assert (status.prompts, status.done) == (4, 4)

    more = load_config(make_config(tmp_path, n=2, max_tokens=12, temperature=1.0, samples_per_prompt=3))
    generate.run(more, quiet=True)
    after = {r.id: r for r in read_records(path)}
    assert set(after) == {*records, *(f"{i}~2" for i in firsts)}
    assert all(after[i].token_ids == records[i].token_ids for i in records)

    one = load_config(make_config(tmp_path, n=2, max_tokens=12, temperature=1.0))
    generate.run(one, quiet=True)
    assert {r.id for r in read_records(path)} == set(firsts)
    assert "generate.samples_per_prompt" not in read_marker(RunPaths.of(one).marker("generate"))["fingerprint"]
    generate.run(more, quiet=True)
    assert {r.id: r.token_ids for r in read_records(path)} == {i: r.token_ids for i, r in after.items()}


def test_several_greedy_answers_to_one_prompt_are_refused_naming_the_keys(tmp_path):
    config_path = make_config(tmp_path, samples_per_prompt=3)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "300"}
    result = subprocess.run(
        [sys.executable, "-m", "eyas", "generate", str(config_path)], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert "generate" in result.stderr and "samples_per_prompt 3 at temperature 0" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
