"""DFlash drafters: the block training scores is the block drafting runs, the layout engines read,
the objective's anchors, the mask token, and an exact resume."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

import eyas.train
from eyas.config import ConfigError, TrainConfig, parse_config
from eyas.drafter.families import DFLASH, family, family_at, load_drafter, read_drafter, save_drafter
from eyas.drafter.families.dflash import DFlashDrafter, DFlashSession, default_mask_token, dflash_spec, sample_anchors
from eyas.drafter.layout import CONFIG_FILE
from eyas.drafter.spec import spec_for_target
from eyas.paths import RunPaths
from eyas.pipeline import preflight
from eyas.target.capture import capture, default_aux_layers, num_decoder_layers
from eyas.train.metrics import read_metrics
from tests.train.conftest import copy_run, load_tiny


def random_dflash(model, layers: int = 2, block_size: int = 4) -> DFlashDrafter:
    torch.manual_seed(0)
    train = TrainConfig(intermediate_size=128, dflash={"layers": layers, "block_size": block_size})
    base = spec_for_target(model.config, train, default_aux_layers(num_decoder_layers(model)), model.config.vocab_size)
    drafter = DFlashDrafter(
        dflash_spec(base, train.dflash, 16), model.get_input_embeddings().weight, model.lm_head.weight
    )
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad and p.ndim == 2:
                p.mul_(3.0)
    return drafter.eval()


def test_a_training_block_is_the_block_drafting_runs(model, tokenizer):
    drafter = random_dflash(model)
    ids = torch.tensor(
        [tokenizer("Speculative decoding drafts tokens that the target then checks in one pass.")["input_ids"]]
    )
    features = capture(model, ids, aux_layers=list(drafter.spec.aux_layers)).aux
    anchors = torch.tensor([[3, 7, 11]])
    with torch.no_grad():
        trained = drafter.blocks(features, ids, anchors)[0]
    for n, a in enumerate(anchors[0].tolist()):
        session = DFlashSession(drafter)
        # Committed positions 0..a-1 (each with its next token); the block then starts at a.
        session.append(features[0, :a], ids[0, 1 : a + 1])
        served = session.block_logits(3)
        assert torch.allclose(trained[n], served, atol=1e-4), (a, (trained[n] - served).abs().max())
        assert session.propose(3) == (trained[n].argmax(-1).tolist(), None)


def test_anchors_fall_where_the_next_token_is_an_answer():
    loss_mask = torch.zeros(2, 12, dtype=torch.bool)
    loss_mask[0, 5:] = True
    loss_mask[1, 9:11] = True
    first = sample_anchors(loss_mask, 4, [1, 2])
    again = sample_anchors(loss_mask[:1], 4, [1])
    assert torch.equal(first[:1], again), "a sample's blocks depend on its seed alone, not on its batch"
    row0 = first[0].tolist()
    assert len(set(row0)) == 4 and all(loss_mask[0, a + 1] for a in row0)
    assert sorted(first[1].tolist()) == [-1, -1, 8, 9], "two candidates, two empty blocks"


def test_the_dflash_layout_is_what_the_engines_read(model, tmp_path):
    drafter = random_dflash(model, layers=2, block_size=5)
    save_drafter(drafter, tmp_path)
    config = (tmp_path / CONFIG_FILE).read_text()
    assert '"DFlashDraftModel"' in config and '"target_layer_ids": [\n      1,\n      14,\n      26' in config
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert "fc.weight" in weights and "layers.1.self_attn.q_norm.weight" in weights and "hidden_norm.weight" in weights
    assert not any(k.startswith(("embed_tokens", "lm_head", "target_head")) for k in weights), "the target's own"
    spec, read = read_drafter(tmp_path)
    assert spec == drafter.spec and family_at(tmp_path) is DFLASH
    assert all(torch.equal(read[k], v) for k, v in drafter.trainable_state_dict().items())
    loaded = load_drafter(tmp_path, model)
    assert isinstance(loaded, DFlashDrafter) and loaded.spec.block_size == 5


def test_the_default_mask_token_is_a_spare_special_token(tokenizer):
    stop = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert tokenizer.convert_ids_to_tokens(default_mask_token(tokenizer, stop)) == "<empty_output>"


@pytest.mark.parametrize("drafter", ["dflash", ["eagle3", "dflash"]])
def test_dflash_settings_that_cannot_work_are_refused_by_key(tmp_path, drafter):
    base = {"run_dir": str(tmp_path), "target": {"device": "cpu"}}
    with pytest.raises(ConfigError, match=r"train\.init_from: .*a DFlash drafter trains from random weights"):
        preflight(parse_config({**base, "train": {"drafter": drafter, "init_from": "elsewhere"}}))
    with pytest.raises(ConfigError, match="block_size"):
        parse_config({**base, "train": {"drafter": drafter, "dflash": {"block_size": 1}}})


def test_a_list_of_families_names_each_once_and_one_family_keeps_the_usual_layout(tmp_path):
    base = {"run_dir": str(tmp_path), "target": {"device": "cpu"}}
    for bad in ([], ["dflash", "dflash"], ["eagle3", "medusa"]):
        with pytest.raises(ConfigError, match=r"train\.drafter"):
            parse_config({**base, "train": {"drafter": bad}})
    one = parse_config({**base, "train": {"drafter": ["dflash"]}})
    assert one.train.drafter == "dflash" and one.drafter_views() == [one]
    assert RunPaths.of(one).train_final == tmp_path / "train" / "final"
    both = parse_config({**base, "train": {"drafter": ["dflash", "eagle3"]}})
    views = both.drafter_views()
    assert [v.train.drafter for v in views] == ["dflash", "eagle3"]
    assert [family(v.train.drafter).lr(v.train) for v in views] == [both.train.lr] * 2
    tuned = parse_config({**base, "train": {"drafter": ["dflash", "eagle3"], "lr": 6e-4, "dflash": {"lr": 2e-3}}})
    assert [family(v.train.drafter).lr(v.train) for v in tuned.drafter_views()] == [2e-3, 6e-4]
    paths = RunPaths.of(views[0])
    assert paths.train_final == tmp_path / "dflash" / "train" / "final"
    assert paths.rebuilding("train").train_dir == tmp_path / "dflash" / "train.redo"
    assert paths.export_gguf.parent.parent == tmp_path / "dflash" / "export"
    assert paths.merge_dir == tmp_path / "merge" and paths.hidden_dir == tmp_path / "hidden"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, own",
    [("dflash", {}), ("dflash2", {"selector_rank": 8, "selector_top_k": 4})],
    ids=["dflash", "dflash2 (convolutions and selector)"],
)
def test_a_resumed_block_drafter_run_continues_bit_for_bit(merged_run, tmp_path, name, own):
    other = copy_run(merged_run, tmp_path / "resumed")
    settings = {
        "drafter": name,
        name: {"block_size": 3, "anchors": 4, "lr": 3e-3, **own},
        "lr": 1e-4,
        "max_steps": 4,
        "epochs": 10.0,
        "checkpoint_every": 2,
        "tau_prompts": 1,
        "eval_every": 2,
    }
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True)
    straight = read_metrics(merged_run / "train" / "metrics.jsonl")
    assert [r["step"] for r in straight if r["split"] == "train"] == [1, 2, 3, 4]
    assert all(len(r["acc"]) == 2 for r in straight if r["split"] == "train"), "one figure per drafted position"
    assert max(r["lr"] for r in straight if r["split"] == "train") > 1e-3, f"trains at train.{name}.lr"

    first = eyas.train.run(load_tiny(other, **settings), quiet=True, stop_after=3)
    assert first["step"] == 3 and first["final"] is None
    # Resume from step 2, so step 3 (its blocks drawn again from the step's seed) is redone.
    shutil.rmtree(other / "train" / "checkpoints" / "step-00000003")
    eyas.train.run(load_tiny(other, **settings), quiet=True)
    resumed = read_metrics(other / "train" / "metrics.jsonl")
    train_rows = [(r["step"], r["loss"], r["loss_steps"], r["lr"]) for r in straight if r["split"] == "train"]
    assert train_rows == [(r["step"], r["loss"], r["loss_steps"], r["lr"]) for r in resumed if r["split"] == "train"]
    w1 = load_file(str(merged_run / "train" / "final" / "model.safetensors"))
    w2 = load_file(str(other / "train" / "final" / "model.safetensors"))
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert family_at(merged_run / "train" / "final") is family(name)
