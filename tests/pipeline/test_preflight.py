"""``eyas run`` refuses, before generating anything, what would stop a later stage: a target or
drafter the llama.cpp eyas runs cannot serve, settings a family cannot train with."""

from __future__ import annotations

import pytest
import transformers
import yaml

from eyas import pipeline
from eyas.config import ConfigError, load_config
from eyas.paths import RunPaths
from tests.conftest import write_jsonl
from tests.tiny_targets import ARCHITECTURES, COMMON


def _config(tmp_path, target: str, **train):
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hello."}])
    data = {
        "run_dir": "run",
        "target": {"model": target, "device": "cpu"},
        "datasets": [{"name": "tiny", "source": "p.jsonl"}],
        "eval": {"engine": "llamacpp"},
        "train": train,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    return load_config(tmp_path / "run.yaml")


def test_a_target_llamacpp_cannot_serve_is_refused_before_generating(tmp_path):
    """Gemma-3's graph in the pinned llama.cpp never hands a drafter the layer inputs: found once
    generation, extraction and training had run, before."""
    config_class, settings = ARCHITECTURES["Gemma-3"]
    gemma = getattr(transformers, config_class)(**{**COMMON, **settings}, vocab_size=64)
    gemma.architectures = ["Gemma3ForCausalLM"]  # what the model's own save writes
    gemma.save_pretrained(tmp_path / "gemma")
    config = _config(tmp_path, str(tmp_path / "gemma"))
    with pytest.raises(ConfigError, match=r"cannot serve this target's EAGLE-3 drafter: .*gemma3"):
        pipeline.run(config, quiet=True)
    assert not RunPaths.of(config).generate_dir.exists(), "nothing was generated"
    pipeline.preflight(config, pipeline.select(last="merge"))


def test_an_option_llamacpp_does_not_read_is_refused_before_generating(tmp_path):
    config = _config(tmp_path, "embedded", eagle3={"norm_output": True})
    with pytest.raises(ConfigError, match=r"does not read norm_output .*train\.eagle3\.norm_output"):
        pipeline.run(config, quiet=True)
    assert not RunPaths.of(config).generate_dir.exists()
