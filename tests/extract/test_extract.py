import json
import os

import pytest
import torch
from safetensors import safe_open

from eyas import extract, pipeline
from eyas.config import ConfigError
from eyas.extract import storage
from eyas.extract.estimate import gather
from eyas.extract.plan import bytes_per_token
from eyas.extract.reader import HiddenStates
from eyas.merge.reader import iter_split
from eyas.paths import RunPaths
from eyas.stage import StageError, check, read_marker
from eyas.target.capture import default_aux_layers, forward, num_decoder_layers
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
        ["index.json", "stage.json"]
        + [s["file"] for s in index["shards"]]
        + [s["file"].replace(".safetensors", ".json") for s in index["shards"]]
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
            torch.testing.assert_close(
                sample.aux[:, k * h : (k + 1) * h], ref[layer + 1][0].bfloat16(), atol=0.05, rtol=0.02
            )
        torch.testing.assert_close(sample.final, ref[-1][0].bfloat16(), atol=0.05, rtol=0.02)
    assert index["num_tokens"] == sum(len(r["input_ids"]) for r in train)
    assert index["bytes"] == sum((paths.hidden_dir / s["file"]).stat().st_size for s in index["shards"])
    # The measured throughput is what `eyas estimate` then uses.
    assert gather(merged_run).throughput == index["tokens_per_s"] > 0


def test_fp8_quantizes_aux_only_and_keeps_final_exact(merged_run, tmp_path):
    bf16 = extract.run(merged_run, quiet=True)
    fp8_config = with_extract(merged_run.model_copy(update={"run_dir": str(tmp_path / "fp8")}), dtype="fp8")
    (tmp_path / "fp8").mkdir()
    import shutil

    shutil.copytree(RunPaths.of(merged_run).merge_dir, RunPaths.of(fp8_config).merge_dir)
    fp8 = extract.run(fp8_config, quiet=True)
    h = fp8["hidden_size"]
    # Aux in e4m3 + a float32 scale per token and aux layer, final in bf16: 2,897 vs 4,613 bytes a token (+ headers).
    assert fp8["dtype"] == "fp8" and fp8["bytes"] / bf16["bytes"] == pytest.approx(
        bytes_per_token(h, 3, "fp8") / bytes_per_token(h, 3, "bf16"), abs=0.01
    )
    assert "aux_scale" in fp8["tensors"] and "final_scale" not in fp8["tensors"]
    fp8_dir = RunPaths.of(fp8_config).hidden_dir
    for s in fp8["shards"]:
        with safe_open(str(fp8_dir / s["file"]), framework="pt") as f:
            assert "final_scale" not in f.keys()
            assert f.get_slice("final").get_dtype() == "BF16" and f.get_slice("aux").get_dtype() == "F8_E4M3"
    exact, quantized = HiddenStates(RunPaths.of(merged_run).hidden_dir), HiddenStates(fp8_dir)
    aux_differs = False
    for i in range(len(exact)):
        a, b = exact[i], quantized[i]
        assert b.aux.dtype == b.final.dtype == torch.bfloat16
        # The teacher's input is untouched: final is bit for bit the bf16 run's.
        assert torch.equal(a.final.view(torch.int16), b.final.view(torch.int16))
        aux_differs |= not torch.equal(a.aux, b.aux)
        for k in range(3):
            x, y = a.aux[:, k * h : (k + 1) * h].float(), b.aux[:, k * h : (k + 1) * h].float()
            # e4m3 keeps 3 mantissa bits: error within 1/16 of each row's largest value.
            assert ((x - y).abs() <= x.abs().amax(-1, keepdim=True) / 16 + 1e-2).all()
    assert aux_differs  # aux really is quantized


def test_older_fp8_shards_with_a_final_scale_still_read(tmp_path):
    """An older eyas stored final in e4m3 too, with ``final_scale``; such shards read as before, even beside new ones."""
    torch.manual_seed(0)
    h, lengths = 16, [3, 5]
    aux, final = torch.randn(8, 3 * h) * 4, torch.randn(8, h) * 30
    bounds = [(0, 3), (3, 8)]
    shards = []
    for shard, old in enumerate((True, False)):
        buffer = storage.ShardBuffer([f"s{shard}/a", f"s{shard}/b"], lengths, h, 3, "fp8")
        for i, (lo, hi) in enumerate(bounds):
            buffer.put(i, list(range(lo, hi)), [1] * (hi - lo), aux[lo:hi], final[lo:hi])
        if old:
            buffer.tensors["final"], buffer.tensors["final_scale"] = storage.quantize(final, 1)
        sidecar = storage.write_shard(tmp_path, shard, buffer, {"sample_start": 2 * shard}, storage.clock())
        shards.append({k: sidecar[k] for k in ("file", "samples", "tokens", "bytes", "sha256", "sample_start")})
    index = {
        "format": storage.FORMAT,
        "dtype": "fp8",
        "aux_layers": [1, 14, 26],
        "hidden_size": h,
        "num_samples": 4,
        "shards": shards,
    }
    storage.write_json_atomic(storage.index_path(tmp_path), index)
    hidden = HiddenStates(tmp_path)
    assert hidden.verify() == [] and len(hidden) == 4
    old_final, old_scale = storage.quantize(final, 1)
    for i in range(4):
        sample, (lo, hi) = hidden[i], bounds[i % 2]
        assert sample.id == f"s{i // 2}/{'ab'[i % 2]}" and sample.input_ids.tolist() == list(range(lo, hi))
        assert sample.aux.dtype == sample.final.dtype == torch.bfloat16
        assert torch.equal(sample.aux, storage.dequantize(*storage.quantize(aux[lo:hi], 3)))
        if i < 2:  # old shard: final dequantized with its final_scale, within e4m3 error of the original
            assert torch.equal(sample.final, storage.dequantize(old_final[lo:hi], old_scale[lo:hi]))
            x = final[lo:hi]
            assert ((sample.final.float() - x).abs() <= x.abs().amax(-1, keepdim=True) / 16 + 1e-2).all()
        else:  # new shard: final exact bf16
            assert torch.equal(sample.final, final[lo:hi].bfloat16())


def test_packed_batches_equal_padded_ones(model, extract_rows):
    samples = [r["input_ids"] for r in extract_rows[:3]]
    layers = default_aux_layers(num_decoder_layers(model))
    for (pa, pf), (qa, qf) in zip(
        forward(model, samples, layers, packed=True), forward(model, samples, layers, packed=False)
    ):
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


def test_a_shard_with_a_flipped_byte_is_named_stale_never_read_and_redone_alone(merged_run):
    """A shard whose bytes changed after extract wrote it was trained on as it stood."""
    paths = RunPaths.of(merged_run)
    first = extract.run(merged_run, quiet=True)
    files = [paths.hidden_dir / s["file"] for s in first["shards"]]
    before = {f: f.stat().st_mtime_ns for f in files}
    os.utime(files[0], ns=(before[files[0]] + 5, before[files[0]] + 5))  # copied without its times
    assert check(merged_run, extract.CONTRACT, paths).status == "current", "a moved time alone is no damage"
    index = json.loads(paths.hidden_index.read_text())
    assert index["shards"][0]["mtime_ns"] == before[files[0]] + 5, "its new time recorded: read once, not every check"
    before[files[0]] += 5
    data = bytearray(files[1].read_bytes())
    data[-3] ^= 0x01  # inside the last tensor's values
    files[1].write_bytes(bytes(data))

    state = check(merged_run, extract.CONTRACT, paths)
    assert state.status == "stale" and state.damaged == [str(files[1])]
    assert state.why.startswith(f"{files[1]}: its bytes are not those written")
    assert (
        pipeline.next_step(next(s for s in pipeline.STAGES if s.name == "extract"), state)
        == "redo 1 damaged unit alone"
    )
    states = HiddenStates(paths.hidden_dir)
    with pytest.raises(StageError, match=rf"{files[1].name}: its bytes are not those extract wrote"):
        states[first["shards"][1]["sample_start"]]

    assert pipeline.prepare(merged_run, "extract"), "a stage's own command repairs without --redo"
    second = extract.run(merged_run, quiet=True)
    assert (
        second["shards"][1]["sha256"] == first["shards"][1]["sha256"]
        and not paths.root.joinpath("hidden.redo").exists()
    )
    assert all(f.stat().st_mtime_ns == before[f] for f in files if f != files[1]), "the others were not rewritten"
    assert check(merged_run, extract.CONTRACT, paths).status == "current"


def test_changed_settings_make_the_states_stale_and_a_redo_replaces_them_whole(merged_run):
    paths = RunPaths.of(merged_run)
    first = extract.run(merged_run, quiet=True)
    old_files = {s["file"]: s["sha256"] for s in first["shards"]}
    other = with_extract(merged_run, aux_layers=[2, 10, 20])
    state = check(other, extract.CONTRACT, paths)
    assert state.status == "stale" and state.changes == ["extract.aux_layers: [1, 14, 26] → [2, 10, 20]"]
    with pytest.raises(StageError, match=r"outputs were made with other settings .*`eyas extract CONFIG --redo`"):
        pipeline.prepare(other, "extract")
    second = extract.run(other, quiet=True, redo=True)
    assert second["aux_layers"] == [2, 10, 20] and not paths.root.joinpath("hidden.redo").exists()
    assert {s["file"]: s["sha256"] for s in second["shards"]}.keys() == old_files.keys()
    assert all(storage.file_sha256(paths.hidden_dir / f) != sha for f, sha in old_files.items())
    assert check(other, extract.CONTRACT, paths).status == "current"


def test_states_in_progress_made_otherwise_are_refused_or_discarded(merged_run):
    paths = RunPaths.of(merged_run)
    extract.run(merged_run, quiet=True)
    # A run killed before its index: shards and sidecars only.
    paths.hidden_index.unlink()
    paths.marker("extract").unlink()
    other = with_extract(merged_run, dtype="fp8")
    with pytest.raises(StageError, match=r"made otherwise \(extract.dtype: \"bf16\" → \"fp8\"\).*--redo"):
        extract.run(other, quiet=True)
    index = extract.run(other, quiet=True, redo=True)
    assert index["dtype"] == "fp8" and all(
        json.loads(storage.sidecar_path(paths.hidden_dir, i).read_text())["made_with"]["fingerprint"]["extract.dtype"]
        == "fp8"
        for i in range(len(index["shards"]))
    )


def test_the_states_fingerprint_names_the_target_revision_and_served_dtype(merged_run):
    """It once held the model name alone: states made in another dtype or from another revision
    stayed current."""
    extract.run(merged_run, quiet=True)
    paths = RunPaths.of(merged_run)
    target = merged_run.target
    bf16 = merged_run.model_copy(update={"target": target.model_copy(update={"dtype": "bfloat16"})})
    assert check(bf16, extract.CONTRACT, paths).changes == ['target.dtype: "auto" → "bfloat16"']
    pinned = merged_run.model_copy(update={"target": target.model_copy(update={"revision": "v2"})})
    assert check(pinned, extract.CONTRACT, paths).changes == ['target.revision: null → "v2"']


def test_states_made_with_auto_dtype_stay_current_where_auto_means_another_dtype(merged_run, monkeypatch):
    """`auto` was resolved by the machine that checked: a GPU machine (bfloat16) called these CPU
    states (float32) stale, and `eyas run` there would have extracted them again."""
    target = merged_run.target.model_copy(update={"device": "auto"})
    merged_run = merged_run.model_copy(update={"target": target})
    extract.run(merged_run, quiet=True)
    paths = RunPaths.of(merged_run)
    assert read_marker(paths.marker("extract"))["run"]["resolved"] == {"target.dtype": "float32"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    state = check(merged_run, extract.CONTRACT, paths)
    assert state.status == "current" and "target.dtype: auto meant float32, here it would mean bfloat16" in state.why
    before = paths.marker("extract").read_bytes()
    result = pipeline.run(merged_run, quiet=True, first="extract", last="extract")
    assert result["extract"]["status"] == "up to date" and paths.marker("extract").read_bytes() == before


def test_unservable_aux_layers_are_config_errors(merged_run):
    # The last layer's output is no layer's input, so no server can capture it.
    with pytest.raises(ConfigError, match=r"extract.aux_layers: \[1, 14, 29\] must lie in 0..28 for a 30-layer target"):
        extract.run(with_extract(merged_run, aux_layers=[1, 14, 29]), quiet=True)
    with pytest.raises(ConfigError, match=r"extract.aux_layers: \[3, 1, 2\] must be distinct and strictly ascending"):
        extract.run(with_extract(merged_run, aux_layers=[3, 1, 2]), quiet=True)


def test_online_mode_writes_nothing(merged_run):
    assert extract.run(with_extract(merged_run, mode="online"), quiet=True) is None
    assert not RunPaths.of(merged_run).hidden_dir.exists()


def test_reader_errors_are_clear(tmp_path):
    with pytest.raises(StageError, match="index.json: missing; run `eyas extract CONFIG`"):
        HiddenStates(tmp_path)
    (tmp_path / "index.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(StageError, match="format 'other'"):
        HiddenStates(tmp_path)


def test_non_finite_states_stop_the_run_naming_the_sample(merged_run, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=7,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=49152,
        )
    )
    with torch.no_grad():
        tiny.model.layers[3].mlp.down_proj.weight[0, 0] = float("nan")
    tiny.save_pretrained(tmp_path / "broken")
    config = merged_run.model_copy(
        update={"target": merged_run.target.model_copy(update={"model": str(tmp_path / "broken")})}
    )
    with pytest.raises(StageError, match=r"sample chat/p\d+ \(train row 0\) has NaN/Inf hidden states"):
        extract.run(config, quiet=True)
    assert not list(RunPaths.of(config).hidden_dir.glob("shard-*"))
