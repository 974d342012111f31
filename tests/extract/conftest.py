"""A merged run on the embedded model: one dataset of real greedy answers, two prompts held out."""

from __future__ import annotations

import pytest

from eyas import merge
from eyas.config import RunConfig
from eyas.paths import RunPaths
from tests.corpus import tokenized_rows, write_tokenized
from tests.stages import mark_finished


@pytest.fixture(scope="session")
def extract_rows(tokenizer, model):
    return tokenized_rows(tokenizer, model, "chat", max_new_tokens=8)


@pytest.fixture
def merged_run(tmp_path, extract_rows):
    """A config whose run_dir holds a merged corpus (6 train samples); extract settings via ``with_extract``."""
    paths = RunPaths(tmp_path / "run")
    write_tokenized(paths.tokenized("chat"), extract_rows)
    config = RunConfig.model_validate(
        {
            "run_dir": str(paths.root),
            "target": {"device": "cpu"},
            "datasets": [{"name": "chat", "source": str(tmp_path / "unused.jsonl")}],
            "merge": {"eval_count": 2},
            "extract": {"shard_tokens": 64, "batch_tokens": 96},
        }
    )
    paths.tokenize_report.write_text("{}")
    paths.generations("chat").parent.mkdir()
    paths.generations("chat").touch()
    mark_finished(config, "generate", "tokenize")
    merge.run(config, quiet=True)
    return config


def with_extract(config: RunConfig, **changes) -> RunConfig:
    return config.model_copy(update={"extract": config.extract.model_copy(update=changes)})
