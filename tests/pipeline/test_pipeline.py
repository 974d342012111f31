"""``eyas run`` on a tiny real run: every stage in order, skips when done, refuses stale input."""

from __future__ import annotations

import os
import time

import pytest

from eyas import pipeline
from eyas.config import ConfigError, load_config
from eyas.demo import summarize, summary_table, write_demo_config
from eyas.stage import StageError
from tests.conftest import write_jsonl

PROMPTS = ["Name a fruit.", "What is 3+3?", "Say hello.", "Name a color.", "What day follows Monday?", "Name a pet."]


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    write_jsonl(root / "p.jsonl", [{"prompt": p} for p in PROMPTS])
    (root / "run.yaml").write_text(
        "run_dir: run\n"
        "target: {model: embedded, device: cpu}\n"
        "datasets: [{name: tiny, source: p.jsonl}]\n"
        "generate: {max_tokens: 10, batch_size: 6}\n"
        "merge: {eval_count: 2}\n"
        "extract: {mode: online}\n"
        "train: {ttt_steps: 2, draft_vocab_size: 256, intermediate_size: 128, max_steps: 2, batch_size: 2,"
        " checkpoint_every: 2, eval_every: 2}\n"
        "eval: {max_new_tokens: 6}\n"
    )
    return root / "run.yaml"


def test_stage_names_are_checked(config_path):
    config = load_config(config_path)
    with pytest.raises(ConfigError, match="unknown stage 'trian'"):
        pipeline.run(config, quiet=True, first="trian")
    with pytest.raises(ConfigError, match="--from eval comes after --to merge"):
        pipeline.run(config, quiet=True, first="eval", last="merge")


def test_missing_input_names_the_stage_to_run(config_path):
    with pytest.raises(StageError, match=r"input from stage generate is missing .*--from generate"):
        pipeline.run(load_config(config_path), quiet=True, first="train")


@pytest.mark.slow
def test_full_run_then_skip_then_refuse_stale(config_path):
    config = load_config(config_path)
    results = pipeline.run(config, quiet=True, verify_ids=True)
    assert [s for s, r in results.items() if r["status"] == "ran"] == [
        "generate",
        "tokenize",
        "merge",
        "train",
        "export",
        "eval",
    ]
    assert results["extract"]["status"] == "skipped"
    run_dir = config_path.parent / "run"
    assert (run_dir / "eval" / "report.json").is_file() and (run_dir / "eval" / "acceptance.png").is_file()
    eval_report = results["eval"]["result"]
    assert eval_report["prompts"] == 2
    assert all(m["lossless"]["mismatched"] == [] for m in eval_report["methods"].values())

    summary = summarize(config, results, wall_s=1.0)
    assert summary["rebuild_exact"] == 1.0 and summary["rebuild_verified"] == len(PROMPTS)
    assert summary["lossless"] and summary["train_samples"] == 4 and summary["tau_broken"] >= 1.0
    assert summary["train_seconds"] == results["train"]["seconds"]
    summary_table(summary)

    again = pipeline.run(config, quiet=True, first="tokenize", last="export")
    assert {s: r["status"] for s, r in again.items()} == {
        "tokenize": "up to date",
        "merge": "up to date",
        "extract": "skipped",
        "train": "up to date",
        "export": "up to date",
    }

    # A re-tokenized corpus makes the merge stale: training must not start on it.
    later = time.time() + 5
    os.utime(run_dir / "tokenize" / "report.json", (later, later))
    with pytest.raises(StageError, match=r"stage merge is stale .*--from merge"):
        pipeline.run(config, quiet=True, first="train")

    # Another tokenizer: `eyas tokenize` would redo the ids, so `eyas run` must not skip it either.
    from eyas.target import resolve_target

    other = config.model_copy(
        update={"target": config.target.model_copy(update={"tokenizer": resolve_target(config.target).name_or_path})}
    )
    tokenize_stage = next(s for s in pipeline.STAGES if s.name == "tokenize")
    assert pipeline.state(other, tokenize_stage, None)[0] == "stale"
    assert pipeline.run(other, quiet=True, first="tokenize", last="tokenize")["tokenize"]["status"] == "ran"
    assert pipeline.state(other, tokenize_stage, None)[0] == "done"


def test_demo_config_is_valid_and_states_its_sizes(tmp_path):
    path = write_demo_config(tmp_path)
    config = load_config(path)
    assert config.extract.mode == "online" and config.train.max_steps is not None
    header = path.read_text().split("run_dir:")[0]
    assert "20 minutes on 2 CPU cores" in header and f"{config.train.max_steps} steps" in header
