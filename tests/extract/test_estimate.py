import json
import subprocess
import sys

import numpy as np
import pytest

from eyas.config import RunConfig
from eyas.extract.estimate import Inputs, estimate, gather
from eyas.merge.stats import SplitStats, tokens_over

REFERENCE_TOKENS = 138_000_000


def reference_corpus() -> dict[str, np.ndarray]:
    """Ten datasets, ~40K samples, 138M tokens; one of them 16K-token agentic traces, as in the reference job."""
    rng = np.random.default_rng(0)
    corpus = {f"d{i}": rng.integers(200, 7000, 3900) for i in range(9)}
    corpus["agentic"] = rng.integers(12_000, 20_000, 2900)
    scale = REFERENCE_TOKENS / sum(int(v.sum()) for v in corpus.values())
    corpus = {k: np.maximum(1, (v * scale).astype(np.int64)) for k, v in corpus.items()}
    corpus["d0"][0] += REFERENCE_TOKENS - sum(int(v.sum()) for v in corpus.values())
    return corpus


def histograms(corpus: dict[str, np.ndarray]) -> dict[str, list[dict]]:
    out = {}
    for name, lengths in corpus.items():
        s = SplitStats()
        s.add(lengths, lengths, np.zeros(len(lengths), bool))
        out[name] = s.to_json()["length_histogram"]
    return out


def test_reference_shape_is_about_7_9_tb_and_caps_fp8_drops_save():
    corpus = reference_corpus()
    lines = {
        line.scenario: line for line in estimate(Inputs(7168, 61, histograms(corpus), "bf16", 500.0, "test", "test"))
    }
    base = lines["as configured (bf16)"]
    assert base.tokens == REFERENCE_TOKENS
    assert base.bytes == pytest.approx(7.9e12, rel=0.01)  # 138M × 4 × 7,168 × 2 bytes
    assert base.seconds == pytest.approx(REFERENCE_TOKENS / 500.0)
    capped = REFERENCE_TOKENS - sum(int(np.maximum(v - 8192, 0).sum()) for v in corpus.values())
    assert lines["cap at 8,192 tokens"].tokens == capped  # exact: 8,192 is a histogram edge
    # fp8 stores only the 3 aux layers in e4m3 (+ a float32 scale each); final stays bf16: 62.5%, not half.
    assert lines["fp8 storage"].bytes / base.bytes == pytest.approx(
        (3 * 7168 + 3 * 4 + 2 * 7168 + 5) / (4 * 7168 * 2 + 5)
    )
    assert lines["fp8 storage"].bytes / base.bytes == pytest.approx(0.625, abs=0.001)
    assert lines["fp8 storage"].bytes == pytest.approx(4.95e12, rel=0.01)  # 138M × 35,857 bytes
    assert lines["cap at 8,192 tokens + fp8"].bytes < lines["fp8 storage"].bytes
    assert lines["without dataset agentic"].tokens == REFERENCE_TOKENS - corpus["agentic"].sum()


def test_caps_between_histogram_edges_are_approximated_within_a_few_percent():
    lengths = np.random.default_rng(1).integers(100, 30_000, 5000)
    h = histograms({"d": lengths})["d"]
    for cap in (5000, 7000, 10_000):
        exact = np.maximum(lengths - cap, 0).sum()
        assert tokens_over(h, cap) == pytest.approx(exact, rel=0.05)


def write_reference_target(directory):
    directory.mkdir()
    (directory / "config.json").write_text(
        json.dumps(
            {
                "model_type": "deepseek_v3",
                "architectures": ["DeepseekV3ForCausalLM"],
                "hidden_size": 7168,
                "num_hidden_layers": 61,
                "vocab_size": 163840,
            }
        )
    )
    return directory


def test_eyas_estimate_reads_only_the_targets_config_and_merge_stats(tmp_path):
    target = write_reference_target(tmp_path / "kimi-shape")
    run_dir = tmp_path / "run"
    (run_dir / "merge").mkdir(parents=True)
    stats = {
        "datasets": {name: {"train": {"length_histogram": h}} for name, h in histograms(reference_corpus()).items()}
    }
    (run_dir / "merge" / "stats.json").write_text(json.dumps(stats))
    config = tmp_path / "run.yaml"
    config.write_text(
        f"run_dir: run\ntarget:\n  model: {target}\n"
        "extract:\n  engine: vllm\n  tensor_parallel_size: 8\n  expert_parallel: true\n  throughput_tokens_per_s: 480\n"
    )
    result = subprocess.run([sys.executable, "-m", "eyas", "estimate", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "hidden 7,168, 61 layers" in out
    title = " ".join(out.split())  # the title wraps at the table's width
    assert "engine vllm (tensor parallel 8, expert parallel)" in title and "480 tok/s assumed" in title
    assert "7.9 TB" in out and "79.9 h" in out  # 138M tokens at 480 tok/s
    assert "cap at 8,192 tokens" in out and "fp8 storage" in out and "without dataset agentic" in out


def test_before_merge_it_reads_tokenize_lengths_and_before_generation_the_prompts(tmp_path, target_config):
    from tests.conftest import write_jsonl
    from tests.corpus import write_tokenized

    source = write_jsonl(tmp_path / "x.jsonl", [{"prompt": "Say hello."}, {"prompt": "Name a fruit."}])
    config = RunConfig.model_validate({"run_dir": str(tmp_path), "datasets": [{"name": "a", "source": str(source)}]})
    early = gather(config)
    assert early.source.startswith("expected from the prompts, answers at up to generate.max_tokens 512")
    assert sum(r["samples"] for r in early.histograms["a"]) == 2
    assert sum(r["tokens"] for r in early.histograms["a"]) > 2 * 512, "every answer may run to the cap"
    rows = [
        {
            "id": f"a/{i}",
            "dataset": "a",
            "input_ids": [1] * n,
            "loss_mask": [1] * n,
            "num_tokens": n,
            "completion_tokens": n,
            "billed_completion_tokens": n,
            "finish_reason": "stop",
            "format": "chatml",
            "flags": [],
        }
        for i, n in enumerate((10, 20, 3000))
    ]
    write_tokenized(tmp_path / "tokenize" / "a.parquet", rows)
    inputs = gather(config)
    assert inputs.hidden_size == 576 and inputs.num_layers == 30 and inputs.throughput is None
    base = estimate(inputs)[0]
    assert base.tokens == 3030 and base.bytes == 3030 * (4 * 576 * 2 + 5) and base.seconds is None


def test_a_measured_throughput_replaces_the_assumption_only_for_the_engine_that_measured_it(tmp_path):
    from tests.corpus import write_tokenized

    rows = [
        {
            "id": "a/0",
            "dataset": "a",
            "input_ids": [1] * 10,
            "loss_mask": [1] * 10,
            "num_tokens": 10,
            "completion_tokens": 10,
            "billed_completion_tokens": 10,
            "finish_reason": "stop",
            "format": "chatml",
            "flags": [],
        }
    ]
    write_tokenized(tmp_path / "tokenize" / "a.parquet", rows)
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "index.json").write_text(json.dumps({"tokens_per_s": 900.0, "engines": ["vllm"]}))

    def inputs(engine: str):
        return gather(
            RunConfig.model_validate(
                {
                    "run_dir": str(tmp_path),
                    "datasets": [{"name": "a", "source": "x.jsonl"}],
                    "extract": {"engine": engine, "throughput_tokens_per_s": 300},
                }
            )
        )

    vllm, transformers = inputs("vllm"), inputs("transformers")
    assert vllm.throughput == 900.0 and "measured by the last extract (vllm)" in vllm.throughput_source
    assert transformers.throughput == 300 and "assumed" in transformers.throughput_source
    assert transformers.engine.startswith("transformers") and vllm.engine == "vllm (tensor parallel 1)"
