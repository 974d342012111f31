"""``extract.engine: vllm``: the states vLLM captures are the transformers engine's.

Runs where vLLM is installed (``make test`` builds ``.venv-vllm``); skipped elsewhere, saying
why. Each vLLM start takes about a minute on these CPUs, so the tests are few and share work.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import eyas.extract
import eyas.train
from eyas.config import parse_config
from eyas.paths import RunPaths
from eyas.target.capture import default_aux_layers, num_decoder_layers
from eyas.target.engines import TransformersPrefill
from eyas.target.settings import PrefillCapture
from eyas.target.vllm_engine import VllmPrefill
from eyas.train.metrics import read_metrics
from tests.conftest import vllm_or_skip
from tests.extract.conftest import with_extract
from tests.extract.test_extract_processes import kill_after_first_shard, resume, write_config
from tests.train.conftest import tiny_config

pytestmark = pytest.mark.slow
BF16_ULP = 2.0**-7
"""One bf16 step relative to a value's magnitude (8 significant bits): a float32 difference of
1e-6 can still round to neighbouring bf16 values."""


def test_vllm_captures_the_transformers_states_in_float32(merged_run, model, extract_rows, tmp_path):
    vllm_or_skip()
    samples = [r["input_ids"] for r in extract_rows[:4]]
    layers = default_aux_layers(num_decoder_layers(model))
    capture = PrefillCapture.from_config(with_extract(merged_run, engine="vllm").extract)
    with VllmPrefill(
        merged_run.target,
        capture,
        layers,
        num_decoder_layers(model),
        max(map(len, samples)),
        tmp_path / "staging",
        tmp_path / "vllm.log",
    ) as vllm:
        got = vllm.capture(samples)
    assert not list(tmp_path.glob("staging*")), "the per-sample files are read and removed"
    want = TransformersPrefill(model, layers, "padded").capture(samples)
    h = model.config.hidden_size
    for (aux, final), (ref_aux, ref_final) in zip(got, want):
        assert (
            aux.dtype == final.dtype == torch.float32 and aux.shape == ref_aux.shape and final.shape == ref_final.shape
        )
        for k in range(3):
            ref = ref_aux[:, k * h : (k + 1) * h]
            # Measured: at most 7e-7 of the layer's largest magnitude (4e-6 for the final state).
            assert (aux[:, k * h : (k + 1) * h] - ref).abs().max() <= 1e-3 * ref.abs().max()
        assert (final - ref_final).abs().max() <= 1e-3 * ref_final.abs().max()


def test_killed_vllm_extract_resumes_and_trains_like_transformers_shards(merged_run, tmp_path):
    """First vLLM's child is killed (exit 1 naming its log, its engine gone with it), then eyas
    itself (no orphan engine); each rerun keeps the shards finished before."""
    vllm_or_skip()
    transformers_run = with_extract(
        merged_run.model_copy(update={"run_dir": str(tmp_path / "reference")}), shard_tokens=1
    )
    shutil.copytree(RunPaths.of(merged_run).merge_dir, RunPaths.of(transformers_run).merge_dir)
    reference = eyas.extract.run(transformers_run, quiet=True)

    config = write_config(merged_run, tmp_path / "run.yaml", shard_tokens=1, engine="vllm")  # one sample per shard
    hidden = RunPaths.of(merged_run).hidden_dir
    orphans: list[int] = []
    said, finished = kill_after_first_shard(config, hidden, orphans, engine=True)
    assert "error: vLLM (extract) exited with -9" in said and str(hidden / "vllm.log") in said, said
    assert orphans == [], "vLLM's engine and workers must die with their child"
    said, after = kill_after_first_shard(config, hidden, orphans)
    assert orphans == [], "vLLM's engine and workers must die with the eyas that started them"
    assert {p: after[p] for p in finished} == finished, "the shards finished before the child died are kept"
    resume(config, merged_run, after)
    assert not list(hidden.glob("vllm-staging*"))
    index = json.loads((hidden / "index.json").read_text())
    assert index["engines"] == ["vllm"] and index["fingerprint"] == reference["fingerprint"]
    for ours, theirs in zip(index["shards"], reference["shards"]):
        got = load_file(hidden / ours["file"])
        want = load_file(RunPaths.of(transformers_run).hidden_dir / theirs["file"])
        for name in ("input_ids", "loss_mask", "offsets"):
            assert torch.equal(got[name], want[name])
        for name in ("aux", "final"):
            a, b = got[name].float(), want[name].float()
            # Stored in bf16: states that agree to ~1e-6 of the largest in float32 round at most one
            # step apart, or differ by that float32 error where values are near zero.
            allowed = BF16_ULP * torch.maximum(a.abs(), b.abs()) + 1e-5 * b.abs().max()
            assert ((a - b).abs() <= allowed).all(), name

    losses = []
    for run in (merged_run, transformers_run):
        train = parse_config(tiny_config(RunPaths.of(run).root, "offline", max_steps=3, epochs=10.0))
        eyas.train.run(train, quiet=True)
        losses.append([r["loss"] for r in read_metrics(RunPaths.of(run).root / "train" / "metrics.jsonl")])
    assert len(losses[0]) == 3
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)
