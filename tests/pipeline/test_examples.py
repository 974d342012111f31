"""The shipped example configs load through ``eyas config show`` and say what they promise."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from eyas.cli import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _show(name: str) -> dict:
    result = CliRunner().invoke(app, ["config", "show", str(EXAMPLES / name)])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


def test_kimi_reference_job():
    c = _show("kimi-k2.5-openrouter.yaml")
    assert len(c["datasets"]) == 6
    assert sum(d["output_token_target"] for d in c["datasets"]) == 10_000_000
    assert c["generate"]["backend"] == "openai"
    h = c["generate"]["http"]
    assert h["concurrency"] == 2000 and h["budget_usd"] == 100
    assert h["reasoning"]["enabled"] is True
    allowed = h["provider_policy"]["quantizations"]
    assert not {"fp4", "fp6"} & set(allowed) and h["provider_policy"]["unknown_quantization"] == "deny"
    assert c["tokenize"]["format"] == "kimi-k2.5"
    assert c["merge"]["max_seq_len"] == 8192
    x = c["extract"]
    # ~1T parameters do not fit one GPU: vLLM splits the INT4 release as shipped over 8.
    assert x["mode"] == "offline" and x["engine"] == "vllm" and x["tensor_parallel_size"] == 8
    assert c["target"]["dtype"] == "auto" and x["throughput_tokens_per_s"] > 0
    assert c["eval"]["engine"] == "vllm" and c["eval"]["in_process"] is False and c["eval"]["tensor_parallel_size"] == 8
    text = (EXAMPLES / "kimi-k2.5-openrouter.yaml").read_text()
    assert (
        "eyas extract examples/kimi-k2.5-openrouter.yaml" in text
        and "torchrun --nproc-per-node 8 -m eyas train" in text
    )


def test_smollm2_full_run_is_local_and_offline():
    c = _show("smollm2-full.yaml")
    assert c["target"]["model"] == "embedded" and c["generate"]["backend"] == "local"
    assert c["extract"]["mode"] == "offline"
    assert c["datasets"][0]["source"].endswith("examples/prompts/smollm2-synth.jsonl")
    assert c["eval"]["num_draft_tokens"] == 3
