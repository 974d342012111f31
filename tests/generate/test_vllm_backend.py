"""``generate.backend: vllm`` on the embedded target: the local backend's greedy ids, its records, its resume.

Runs where vLLM is installed (``make test`` builds ``.venv-vllm``); skipped elsewhere, saying why.
"""

from __future__ import annotations

import pytest

from eyas import generate
from eyas.config import load_config
from eyas.generate.store import read_records
from eyas.paths import RunPaths
from tests.conftest import vllm_or_skip

from .test_local import make_config


@pytest.mark.slow
def test_vllm_generates_the_local_backends_greedy_ids_and_resumes(tmp_path):
    vllm_or_skip()
    (tmp_path / "local").mkdir()
    (tmp_path / "vllm").mkdir()
    local = load_config(make_config(tmp_path / "local", n=4, max_tokens=24))
    generate.run(local, quiet=True)
    expected = {r.prompt_id: r for r in read_records(RunPaths.of(local).generations("qa"))}

    config = load_config(make_config(tmp_path / "vllm", n=3, backend="vllm", max_tokens=24))
    generate.run(config, quiet=True)
    # One more prompt in the dataset: the rerun generates only that one.
    config = load_config(make_config(tmp_path / "vllm", n=4, backend="vllm", max_tokens=24))
    generate.run(config, quiet=True)
    records = list(read_records(RunPaths.of(config).generations("qa")))
    assert len(records) == 4 and len({r.prompt_id for r in records}) == 4
    for r in records:
        want = expected[r.prompt_id]
        # float32 on CPU: vLLM's greedy ids are the transformers backend's, token for token.
        assert r.token_ids == want.token_ids and r.content == want.content
        assert r.finish_reason == want.finish_reason and r.usage == want.usage
        assert r.provider == "vllm"
