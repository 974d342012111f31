"""Shared fixtures: the real embedded target (SmolLM2-135M-Instruct), loaded once per session.

EYAS_CACHE points inside the checkout (``.cache/eyas-test``, git-ignored) so a clean clone
exercises the real GGUF conversion instead of reusing a cache left on the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("EYAS_CACHE", str(ROOT / ".cache" / "eyas-test"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def target_config():
    from eyas.config import TargetConfig

    return TargetConfig(model="embedded", device="cpu")


@pytest.fixture(scope="session")
def tokenizer(target_config):
    from eyas.target import load_tokenizer

    return load_tokenizer(target_config)


@pytest.fixture(scope="session")
def model(target_config):
    from eyas.target import load_model

    return load_model(target_config)


def write_jsonl(path: Path, rows: list) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def vllm_or_skip() -> str:
    """vLLM's interpreter, or skip saying why (``make test`` builds ``.venv-vllm``, so there it runs)."""
    from eyas.config import ConfigError
    from eyas.target.vllm import vllm_python

    try:
        return vllm_python(None)
    except ConfigError as e:
        pytest.skip(str(e))
