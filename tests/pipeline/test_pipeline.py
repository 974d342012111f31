"""``eyas run`` on a tiny real run: every stage in order, skips when done, refuses stale input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from eyas import pipeline
from eyas.config import ConfigError, load_config
from eyas.demo import summarize, summary_table, write_demo_config
from eyas.paths import RunPaths
from eyas.stage import StageError, read_marker
from eyas.train.metrics import read_metrics
from tests.conftest import write_jsonl

EVERY_ACTIVE_STAGE = ["generate", "tokenize", "merge", "train", "export", "eval"]
"""Every stage but extract, which online training does without."""
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


@pytest.fixture(scope="module")
def finished(config_path):
    """The tiny run, every stage done once; tests that change it work on a copy (:func:`copy_of`)."""
    return pipeline.run(load_config(config_path), quiet=True, verify_ids=True)


def copy_of(config_path, tmp_path, edit=None):
    """A copy of the finished run (config and run directory), its config edited by ``edit``."""
    root = tmp_path / "copy"
    shutil.copytree(config_path.parent, root)
    path = root / "run.yaml"
    if edit is not None:
        data = yaml.safe_load(path.read_text())
        edit(data)
        path.write_text(yaml.safe_dump(data))
    return path


def weights(config_path) -> bytes:
    return (config_path.parent / "run" / "train" / "final" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_full_run_then_skip_then_refuse_stale(config_path, finished):
    config = load_config(config_path)
    results = finished
    assert [s for s, r in results.items() if r["status"] == "ran"] == EVERY_ACTIVE_STAGE
    assert results["extract"]["status"] == "skipped"
    run_dir = config_path.parent / "run"
    assert (run_dir / "eval" / "report.json").is_file() and (run_dir / "eval" / "acceptance.png").is_file()
    eval_report = results["eval"]["result"]
    assert eval_report["prompts"] == 2
    assert all(m["lossless"]["mismatched"] == [] for m in eval_report["methods"].values())

    summary = summarize(config, results, wall_s=1.0)
    assert summary["rebuild_exact"] == 1.0 and summary["rebuild_verified"] == len(PROMPTS)
    assert summary["lossless"] and summary["train_samples"] == 4 and summary["tau_broken"] >= 1.0
    assert summary["train_seconds"] == pytest.approx(results["train"]["seconds"], rel=0.2)
    summary_table(summary)

    assert {name: s.status for name, s in pipeline.statuses(config).items()} == dict.fromkeys(
        ["generate", "tokenize", "merge", "train", "export", "eval"], "current"
    )
    again = pipeline.run(config, quiet=True, first="tokenize", last="export")
    assert {s: r["status"] for s, r in again.items()} == {
        "tokenize": "ran",
        "merge": "up to date",
        "extract": "skipped",
        "train": "up to date",
        "export": "up to date",
    }

    # Another shuffle seed: the corpus training would read is not the one merge would make now.
    reseeded = config.model_copy(update={"merge": config.merge.model_copy(update={"seed": 1})})
    with pytest.raises(StageError, match=r"stage merge is stale \(merge.seed: 0 → 1\).*--from merge"):
        pipeline.run(reseeded, quiet=True, first="train")

    # Another tokenizer: `eyas tokenize` would redo the ids, so `eyas run` must not skip it either;
    # the local backend encoded its prompts with it too, so the answers are named first.
    from eyas.target import resolve_target

    tokenizer = resolve_target(config.target).name_or_path
    other = config.model_copy(update={"target": config.target.model_copy(update={"tokenizer": tokenizer})})
    states = pipeline.statuses(other)
    (change,) = states["generate"].changes
    assert change.startswith('target.tokenizer: (default) → "')
    assert states["tokenize"].status == "stale" and states["merge"].changes == ["generate before it is stale"]


@pytest.mark.slow
def test_a_new_prompt_row_retrains_the_drafter(config_path, finished, tmp_path):
    """Measured on d647f44: with online extraction, one more prompt row and `eyas run --to train`
    exited 0 and left the drafter's weights byte-identical."""
    copy = copy_of(config_path, tmp_path)
    before = weights(copy)
    with (copy.parent / "p.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": "Name a bird."}) + "\n")
    config = load_config(copy)
    (change,) = pipeline.statuses(config)["generate"].changes
    assert change.startswith("datasets[tiny].source content: ")
    results = pipeline.run(config, quiet=True, last="train")
    assert [s for s, r in results.items() if r["status"] == "ran"] == ["generate", "tokenize", "merge", "train"]
    assert results["merge"]["result"]["train"]["samples"] == 5
    assert weights(copy) != before


@pytest.mark.slow
def test_a_longer_run_continues_from_the_last_checkpoint(config_path, finished, tmp_path):
    """Raising train.max_steps or train.epochs after a finished run was reported up to date."""
    copy = copy_of(config_path, tmp_path, lambda c: c["train"].update(max_steps=3, epochs=2.0))
    config = load_config(copy)
    state = pipeline.statuses(config)["train"]
    assert state.extendable and state.changes == ["train.epochs: 1.0 → 2.0", "train.max_steps: 2 → 3"]
    results = pipeline.run(config, quiet=True, last="train")
    assert results["train"]["result"]["step"] == 3
    marker = read_marker(RunPaths.of(config).marker("train"))
    assert marker["run"]["continued_from_step"] == 2 and marker["fingerprint"]["train.max_steps"] == 3


@pytest.mark.slow
def test_another_corpus_retrains_from_scratch_and_evaluates_anew(config_path, finished, tmp_path):
    """A new merge.seed once retrained nothing: train restored its final checkpoint and wrote the
    old weights with the old vocabulary, and eval reused its per-prompt results."""
    copy = copy_of(config_path, tmp_path, lambda c: c["merge"].update(seed=1))
    before, paths = weights(copy), RunPaths.of(load_config(copy))
    old_train, old_eval = read_marker(paths.marker("train")), read_marker(paths.marker("eval"))
    results = pipeline.run(load_config(copy), quiet=True)
    assert [s for s, r in results.items() if r["status"] == "ran"] == EVERY_ACTIVE_STAGE
    marker = read_marker(paths.marker("train"))
    assert "continued_from_step" not in marker["run"] and weights(copy) != before
    assert [r["step"] for r in read_metrics(paths.train_metrics)] == [1, 2]
    assert marker["inputs"]["merge"] != old_train["inputs"]["merge"]
    new_eval = read_marker(paths.marker("eval"))
    assert new_eval["fingerprint"]["drafter (content)"] != old_eval["fingerprint"]["drafter (content)"]
    assert len(list(paths.eval_dir.glob("results-*.jsonl"))) == 1


@pytest.mark.slow
def test_a_standalone_stage_writes_its_marker_and_refuses_stale_work(config_path, finished, tmp_path):
    """Only `eyas run` wrote markers, so after a standalone `eyas train` later train.* edits were
    invisible to `eyas run`; and stage commands knew no --redo."""
    copy = copy_of(config_path, tmp_path)
    shutil.rmtree(copy.parent / "run" / "train")
    env = {**os.environ, "COLUMNS": "300"}
    eyas = [sys.executable, "-m", "eyas"]
    assert subprocess.run([*eyas, "train", str(copy), "-q"], env=env).returncode == 0
    data = yaml.safe_load(copy.read_text())
    data["train"]["lr"] = 0.002
    copy.write_text(yaml.safe_dump(data))

    status = subprocess.run([*eyas, "status", str(copy)], env=env, capture_output=True, text=True)
    assert status.returncode == 0
    lines = {line.split("│")[1].strip(): line for line in status.stderr.splitlines() if line.count("│") >= 4}
    assert "stale" in lines["train"] and "train.lr: 0.0001 → 0.002" in lines["train"] and "redo" in lines["train"]
    assert "current" in lines["merge"] and "stale" in lines["export"] and "train before it is stale" in lines["eval"]

    refused = subprocess.run([*eyas, "train", str(copy), "-q"], env=env, capture_output=True, text=True)
    assert refused.returncode == 6 and "--redo" in refused.stderr and "train.lr" in refused.stderr
    exported = subprocess.run([*eyas, "export", str(copy), "-q"], env=env, capture_output=True, text=True)
    assert exported.returncode == 6 and "input from stage train is stale" in exported.stderr.replace("\n", " ")
    assert subprocess.run([*eyas, "train", str(copy), "-q", "--redo"], env=env).returncode == 0
    assert pipeline.statuses(load_config(copy))["train"].status == "current"


def test_demo_config_is_valid_and_states_its_sizes(tmp_path):
    path = write_demo_config(tmp_path)
    config = load_config(path)
    assert config.extract.mode == "online" and config.train.max_steps is not None
    header = path.read_text().split("run_dir:")[0]
    assert "20 minutes on 2 CPU cores" in header and f"{config.train.max_steps} steps" in header


@pytest.mark.slow
def test_two_drafter_families_share_the_data_stages_and_are_compared(config_path, finished, tmp_path):
    """Issue 20: `train.drafter: [eagle3, dflash]` trains, exports and evaluates each family from
    the one corpus, each in its own directory, and says which decodes faster."""

    def two_families(c: dict) -> None:
        c["train"].update(drafter=["eagle3", "dflash"])
        c["eval"].update(llamacpp_repeats=1)

    copy = copy_of(config_path, tmp_path, two_families)
    config = load_config(copy)
    run_dir = copy.parent / "run"
    merged = read_marker(run_dir / "merge" / "stage.json")
    trained = read_marker(run_dir / "train" / "final" / "stage.json")
    assert "eyas run moves it here" in pipeline.statuses(config)["train (eagle3)"].why
    results = pipeline.run(config, quiet=True)
    assert read_marker(run_dir / "eagle3" / "train" / "final" / "stage.json") == trained
    # EAGLE-3's drafter, trained before DFlash was added with the same settings, moves, not retrains.
    assert results["train (eagle3)"]["status"] == "up to date" and not (run_dir / "train").exists()
    family_steps = ["export (eagle3)", "eval (eagle3)", *(f"{stage} (dflash)" for stage in ("train", "export", "eval"))]
    assert [s for s, r in results.items() if r["status"] == "ran"] == [
        "generate",
        "tokenize",
        *family_steps,
        "families",
    ]
    assert results["merge"]["status"] == "up to date" and read_marker(run_dir / "merge" / "stage.json") == merged
    for family in ("eagle3", "dflash"):
        assert json.loads((run_dir / family / "train" / "final" / "config.json").read_text())
        report = json.loads((run_dir / family / "eval" / "report.json").read_text())
        assert family in report["methods"] and report["draft"].startswith(str(run_dir / family / "export"))
    summary = json.loads((run_dir / "families.json").read_text())
    assert summary == results["families"]["result"] and set(summary["families"]) == {"eagle3", "dflash"}
    assert summary["best"] in ("eagle3", "dflash") and summary["families"]["dflash"]["lossless"]
    assert summary["faster"] in (summary["best"], None)

    # Each family's steps are current or stale on their own.
    edited = copy_of(
        copy.parent / "run.yaml", tmp_path / "edited", lambda c: c["train"].update(dflash={"block_size": 3})
    )
    states = pipeline.statuses(load_config(edited))
    assert {name: s.status for name, s in states.items() if s.status != "current"} == {
        "train (dflash)": "stale",
        "export (dflash)": "stale",
        "eval (dflash)": "stale",
    }
    assert states["train (dflash)"].changes == ["train.dflash.block_size: 4 → 3"]
    eagle_only = copy_of(copy.parent / "run.yaml", tmp_path / "eagle", lambda c: c["train"].update(ttt_steps=3))
    states = pipeline.statuses(load_config(eagle_only))
    assert [name for name, s in states.items() if s.status != "current"] == [
        "train (eagle3)",
        "export (eagle3)",
        "eval (eagle3)",
    ]

    env = {**os.environ, "COLUMNS": "300"}
    eyas_eval = [sys.executable, "-m", "eyas", "eval", str(copy)]
    refused = subprocess.run(
        [*eyas_eval, "--draft", str(run_dir / "eagle3" / "export" / "sglang")], env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "trains several drafter families" in refused.stderr

    # In the engine the user serves with, the verdict goes by that engine's decode speed.
    in_engine = subprocess.run([*eyas_eval, "--engine", "llamacpp"], env=env, capture_output=True, text=True)
    assert in_engine.returncode == 0, in_engine.stdout + in_engine.stderr
    summary = json.loads((run_dir / "families-llamacpp.json").read_text())
    assert summary["basis"].startswith("llama.cpp") and summary["verdict"][:30] in in_engine.stderr
    for family, row in summary["families"].items():
        section = json.loads((run_dir / family / "eval" / "llamacpp" / "report.json").read_text())["llamacpp"]
        assert row["best_draft"] == section["best_draft"] and row["best_draft"].startswith(f"{family}, n=")
        assert row["speedup"] == section["methods"][row["best_draft"]]["speedup"]
    assert summary["best"] == max(summary["families"], key=lambda f: summary["families"][f]["speedup"])
    assert json.loads((run_dir / "families.json").read_text())["basis"] == results["families"]["result"]["basis"]
