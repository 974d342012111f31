"""A small merged corpus (real completions of the embedded target) and tiny train configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eyas.config import parse_config
from tests.corpus import tokenized_rows, write_tokenized
from tests.stages import mark_finished

EVAL_PROMPTS = ("What color is grass?", "Name a large animal.")


@pytest.fixture(scope="session")
def corpus_rows(tokenizer, model):
    return tokenized_rows(tokenizer, model, "tiny"), tokenized_rows(tokenizer, model, "tiny", prompts=EVAL_PROMPTS)


def write_merged(run_dir: Path, train_rows, eval_rows) -> Path:
    """A merged corpus written by hand, with the markers of the stages that would have made it."""
    merge = run_dir / "merge"
    write_tokenized(merge / "train-00000.parquet", train_rows)
    write_tokenized(merge / "eval-00000.parquet", eval_rows)
    (merge / "stats.json").write_text(json.dumps({"train": len(train_rows), "eval": len(eval_rows)}))
    (run_dir / "tokenize").mkdir()
    (run_dir / "tokenize" / "report.json").write_text("{}")
    mark_finished(load_tiny(run_dir), "generate", "tokenize", "merge")
    return run_dir


@pytest.fixture
def merged_run(tmp_path, corpus_rows):
    return write_merged(tmp_path / "run", *corpus_rows)


def tiny_config(run_dir: Path, mode: str = "online", **train) -> dict:
    """A run config for a small, fast drafter on the embedded target (CPU)."""
    settings = {
        "ttt_steps": 3,
        "draft_vocab_size": 256,
        "intermediate_size": 128,
        "batch_size": 4,
        "lr": 3e-3,
        "warmup_ratio": 0.0,
        "max_seq_len": 64,
        "checkpoint_every": 100,
        "eval_every": 100,
        "tau_new_tokens": 16,
        **train,
    }
    return {"run_dir": str(run_dir), "target": {"device": "cpu"}, "extract": {"mode": mode}, "train": settings}


def load_tiny(run_dir: Path, mode: str = "online", **train):
    return parse_config(tiny_config(run_dir, mode, **train))


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def write_config(run_dir: Path, mode: str = "online", **train) -> Path:
    import yaml

    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(run_dir, mode, **train)))
    return path


def subprocess_env() -> dict:
    """The child computes with as many threads as this process: float sums depend on the split."""
    import os

    import torch

    return {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "COLUMNS": "200"}
