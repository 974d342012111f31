import json

import pytest
import torch

from eyas import extract
from eyas.config import ConfigError
from eyas.estimate import gather
from eyas.extract.capture import default_aux_layers, num_decoder_layers
from eyas.extract.forward import forward
from eyas.extract.reader import HiddenStates
from eyas.merge.reader import iter_split
from eyas.paths import RunPaths
from tests.extract.conftest import with_extract


def reference_states(model, input_ids):
    with torch.inference_mode():
        return model(torch.tensor([input_ids]), output_hidden_states=True).hidden_states


def test_offline_extraction_stores_the_documented_layers_for_every_train_sample(merged_run, model):
    paths = RunPaths.of(merged_run)
    index = extract.run(merged_run, quiet=True)
    hidden = HiddenStates(paths.hidden_dir)
    train = list(iter_split(paths, "train"))
    layers = default_aux_layers(num_decoder_layers(model))
    assert hidden.aux_layers == layers == index["aux_layers"]
    assert index["hf_hidden_state_indices"] == [i + 1 for i in layers]
    assert len(hidden) == len(train) == 6 and len(index["shards"]) > 1
    assert sorted(p.name for p in paths.hidden_dir.iterdir()) == sorted(
        ["index.json"] + [s["file"] for s in index["shards"]] + [s["file"].replace(".safetensors", ".json") for s in index["shards"]]
    )
    assert [i for r in hidden.shard_ranges() for i in r] == list(range(6))
    # Shards are as readable as their JSON sidecars (safetensors alone writes 0600).
    assert len({p.stat().st_mode for p in paths.hidden_dir.iterdir()}) == 1
    assert hidden.verify() == []
    h = hidden.hidden_size
    for i, row in enumerate(train):
        sample = hidden[i]
        assert sample.id == row["id"]
        assert sample.input_ids.tolist() == row["input_ids"] and sample.loss_mask.tolist() == row["loss_mask"]
        assert sample.aux.dtype == sample.final.dtype == torch.bfloat16
        ref = reference_states(model, row["input_ids"])
        for k, layer in enumerate(layers):
            torch.testing.assert_close(sample.aux[:, k * h : (k + 1) * h], ref[layer + 1][0].bfloat16(), atol=0.05, rtol=0.02)
        torch.testing.assert_close(sample.final, ref[-1][0].bfloat16(), atol=0.05, rtol=0.02)
    assert index["num_tokens"] == sum(len(r["input_ids"]) for r in train)
    assert index["bytes"] == sum((paths.hidden_dir / s["file"]).stat().st_size for s in index["shards"])
    # The measured throughput is what `eyas estimate` then uses.
    assert gather(merged_run).throughput == index["tokens_per_s"] > 0


def test_fp8_halves_storage_and_dequantizes_close(merged_run, tmp_path):
    bf16 = extract.run(merged_run, quiet=True)
    fp8_config = with_extract(merged_run.model_copy(update={"run_dir": str(tmp_path / "fp8")}), dtype="fp8")
    (tmp_path / "fp8").mkdir()
    import shutil

    shutil.copytree(RunPaths.of(merged_run).merge_dir, RunPaths.of(fp8_config).merge_dir)
    fp8 = extract.run(fp8_config, quiet=True)
    assert fp8["dtype"] == "fp8" and 0.45 < fp8["bytes"] / bf16["bytes"] < 0.6
    exact, quantized = HiddenStates(RunPaths.of(merged_run).hidden_dir), HiddenStates(RunPaths.of(fp8_config).hidden_dir)
    h = exact.hidden_size
    for i in range(len(exact)):
        a, b = exact[i], quantized[i]
        assert b.aux.dtype == torch.bfloat16
        for k in range(3):
            x, y = a.aux[:, k * h : (k + 1) * h].float(), b.aux[:, k * h : (k + 1) * h].float()
            # e4m3 keeps 3 mantissa bits: error within 1/16 of each row's largest value.
            assert ((x - y).abs() <= x.abs().amax(-1, keepdim=True) / 16 + 1e-2).all()


def test_packed_batches_equal_padded_ones(model, extract_rows):
    samples = [r["input_ids"] for r in extract_rows[:3]]
    layers = default_aux_layers(num_decoder_layers(model))
    for (pa, pf), (qa, qf) in zip(forward(model, samples, layers, packed=True), forward(model, samples, layers, packed=False)):
        torch.testing.assert_close(pa, qa, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(pf, qf, atol=1e-3, rtol=1e-3)


def test_rerun_skips_finished_shards_and_redoes_a_missing_one(merged_run):
    paths = RunPaths.of(merged_run)
    first = extract.run(merged_run, quiet=True)
    files = [paths.hidden_dir / s["file"] for s in first["shards"]]
    before = {f: f.stat().st_mtime_ns for f in files}
    files[1].unlink()
    second = extract.run(merged_run, quiet=True)
    assert files[1].exists() and second["shards"][1]["sha256"] == first["shards"][1]["sha256"]
    assert all(f.stat().st_mtime_ns == before[f] for f in files if f != files[1])


def test_changed_settings_are_refused_not_mixed(merged_run):
    extract.run(merged_run, quiet=True)
    with pytest.raises(ConfigError, match="other extract settings.*delete"):
        extract.run(with_extract(merged_run, aux_layers=[2, 10, 20]), quiet=True)
    with pytest.raises(ConfigError, match=r"extract.aux_layers: need 3 layers in 0..29"):
        extract.run(with_extract(merged_run, aux_layers=[1, 2, 30]), quiet=True)


def test_online_mode_writes_nothing(merged_run):
    assert extract.run(with_extract(merged_run, mode="online"), quiet=True) is None
    assert not RunPaths.of(merged_run).hidden_dir.exists()


def test_reader_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="index.json: missing; run `eyas extract CONFIG`"):
        HiddenStates(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ConfigError, match="format 'other'"):
        HiddenStates(tmp_path)


def test_non_finite_states_stop_the_run_naming_the_sample(merged_run, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, vocab_size=49152))
    with torch.no_grad():
        tiny.model.layers[3].mlp.down_proj.weight[0, 0] = float("nan")
    tiny.save_pretrained(tmp_path / "broken")
    config = merged_run.model_copy(update={"target": merged_run.target.model_copy(update={"model": str(tmp_path / "broken")})})
    with pytest.raises(ConfigError, match=r"sample chat/p\d+ \(train row 0\) has NaN/Inf hidden states"):
        extract.run(config, quiet=True)
    assert not list(RunPaths.of(config).hidden_dir.glob("shard-*"))
