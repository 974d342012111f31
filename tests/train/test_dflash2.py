"""DFlash2 drafters: the block training scores is the walk drafting runs, the convolutions stay
inside their block and start as DFlash, the layout engines read, the objective reaches every
part, and settings that cannot work are refused by key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eyas.config import ConfigError, TrainConfig, parse_config
from eyas.drafter.families import DFLASH2, family_at, load_drafter, read_drafter, save_drafter
from eyas.drafter.families.dflash import DFlashDrafter, dflash_spec
from eyas.drafter.families.dflash2 import (
    BlockConv,
    DFlash2Drafter,
    DFlash2Session,
    DFlash2Spec,
    SelectorObjective,
    training_candidates,
)
from eyas.drafter.layout import CONFIG_FILE
from eyas.drafter.spec import spec_for_target
from eyas.target.capture import capture, default_aux_layers, num_decoder_layers
from eyas.train.data import Batch

TEXT = "Speculative decoding drafts tokens that the target then checks in one pass."


def random_dflash2(model, block_size: int = 4, top_k: int = 8) -> DFlash2Drafter:
    """A random DFlash2 drafter on the embedded target whose convolutions and selector are far from
    their starting identity, so that each changes what is drafted."""
    torch.manual_seed(0)
    train = TrainConfig(intermediate_size=128, dflash={"layers": 2, "block_size": block_size})
    base = spec_for_target(model.config, train, default_aux_layers(num_decoder_layers(model)), model.config.vocab_size)
    spec = DFlash2Spec(**vars(dflash_spec(base, train.dflash, 16)), selector_rank=16, selector_top_k=top_k)
    drafter = DFlash2Drafter(spec, model.get_input_embeddings().weight, model.lm_head.weight)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if not p.requires_grad:
                continue
            if "codebook" in name:
                p.normal_(0, 1.0)
            elif "conv" in name:
                p.add_(torch.randn_like(p) * 0.3)
            elif p.ndim == 2:
                p.mul_(3.0)
    return drafter.eval()


def test_a_training_block_is_the_walk_drafting_runs(model, tokenizer):
    """Drafting walks the selector from the anchor, each position after the token picked before
    it; training feeds the true one. Where the true tokens are the picked ones, training's pick
    at every position is drafting's, from the same logits."""
    drafter = random_dflash2(model)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    features = capture(model, ids, aux_layers=list(drafter.spec.aux_layers)).aux
    reranked = False
    for a in (3, 7):
        session = DFlash2Session(drafter)
        session.append(features[0, :a], ids[0, 1 : a + 1])
        drafts, _ = session.propose(5)
        assert len(drafts) == 3, "block_size − 1 drafts from one pass"
        served = session.block_logits(3)
        drafted = ids.clone()
        drafted[0, a + 1 : a + 4] = torch.tensor(drafts)
        with torch.no_grad():
            logits, scores, label, served_target = drafter.blocks(
                features, drafted, torch.tensor([[a]]), torch.tensor([[drafts]])
            )
        assert torch.allclose(logits[0, 0], served, atol=1e-4)
        assert served_target.all() and torch.equal(scores[0, 0].argmax(-1), label[0, 0]), "training picks the drafts"
        reranked |= drafts != served.argmax(-1).tolist()
    assert reranked, "the selector changed a draft from the unary argmax (else this test shows nothing)"


def test_the_convolutions_start_as_dflash_and_never_reach_across_a_block(model, tokenizer):
    torch.manual_seed(1)
    spec = random_dflash2(model).spec
    conv = BlockConv(spec)
    x = torch.randn(1, 2 * spec.block_size, spec.hidden_size)
    assert torch.equal(conv(x, conv.coefficients(x), 0), x), "tap 0 = 1 and no dynamic part: the identity"

    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    changed = x.clone()
    changed[0, spec.block_size - 1] += 1.0  # the first block's last position
    out, out_changed = (conv(v, conv.coefficients(v), 1) for v in (x, changed))
    differs = (out - out_changed).abs().amax(-1)[0] > 0
    assert differs.tolist() == [False] * (spec.block_size - 1) + [True] + [False] * spec.block_size

    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    fresh = DFlash2Drafter(spec, model.get_input_embeddings().weight, model.lm_head.weight)
    dflash = DFlashDrafter(spec, model.get_input_embeddings().weight, model.lm_head.weight)
    dflash.load_state_dict(fresh.state_dict(), strict=False)
    features = capture(model, ids, aux_layers=list(spec.aux_layers)).aux
    anchors = torch.tensor([[3, 7]])
    with torch.no_grad():
        assert torch.allclose(fresh.block_hidden(features, ids, anchors), dflash.block_hidden(features, ids, anchors))


def test_a_missing_target_replaces_the_weakest_candidate_and_counts_as_unserved():
    logits = torch.tensor([[0.0, 5.0, 3.0, 4.0, 1.0]])
    candidates, label, served = training_candidates(logits, torch.tensor([0]), 3)
    assert candidates.tolist() == [[1, 3, 0]] and label.tolist() == [2] and served.tolist() == [False]
    candidates, label, served = training_candidates(logits, torch.tensor([3]), 3)
    assert candidates.tolist() == [[1, 3, 2]] and label.tolist() == [1] and served.tolist() == [True]


def test_the_objective_reaches_the_convolutions_and_the_selector(model, tokenizer):
    drafter = random_dflash2(model).train()
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    captured = capture(model, ids, aux_layers=list(drafter.spec.aux_layers))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 4:] = True
    batch = Batch(ids, mask, captured.aux.clone(), captured.final.clone(), int(mask.sum()))
    stats = SelectorObjective(6, 4, selector_weight=1.0).stats(drafter, drafter, batch, [0])
    assert len(stats) == 3 and all(torch.isfinite(s.loss_sum) for s in stats)
    sum(s.loss_sum for s in stats).backward()
    grads = dict(drafter.named_parameters())
    for name in (
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
        "candidate_selector.hidden_projection.weight",
        "layers.0.attention_conv.kernel_projection.weight",
        "layers.1.mlp_conv.base_kernel",
    ):
        assert grads[name].grad.abs().sum() > 0, name


def test_the_dflash2_layout_is_what_llamacpp_and_vllm_read(model, tmp_path):
    drafter = random_dflash2(model)
    save_drafter(drafter, tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert config["dflash_config"] == {
        "mask_token_id": 16,
        "target_layer_ids": [1, 14, 26],
        "block_size": 4,
        "conv_kernel_size": 2,
        "conv_group_size": 16,
        "selector_rank": 16,
        "selector_top_k": 8,
    }
    weights = load_file(str(tmp_path / "model.safetensors"))
    h, v, groups = drafter.spec.hidden_size, drafter.spec.vocab_size, drafter.spec.hidden_size // 16
    assert weights["layers.0.attention_conv.base_kernel"].shape == (2, 2, h)
    assert weights["layers.1.mlp_conv.kernel_projection.weight"].shape == (2 * 2 * groups, h)
    assert weights["candidate_selector.predecessor_codebook"].shape == (v, 16)
    assert weights["candidate_selector.hidden_projection.weight"].shape == (16, h)
    assert not any(k.startswith(("embed_tokens", "target_head", "lm_head")) for k in weights), "the target's own"
    spec, _ = read_drafter(tmp_path)
    assert spec == drafter.spec and family_at(tmp_path) is DFLASH2
    loaded = load_drafter(tmp_path, model)
    assert all(torch.equal(loaded.trainable_state_dict()[k], w) for k, w in drafter.trainable_state_dict().items())


def test_dflash2_settings_that_cannot_work_are_refused_by_key(tmp_path, model):
    base = {"run_dir": str(tmp_path), "target": {"device": "cpu"}}
    with pytest.raises(ConfigError, match=r"train\.dflash2: .*conv_kernel_size: 5 taps"):
        parse_config({**base, "train": {"drafter": "dflash2", "dflash2": {"conv_kernel_size": 5}}})
    train = TrainConfig(intermediate_size=128)
    sizes = spec_for_target(model.config, train, [1, 14, 26], model.config.vocab_size)
    for settings, key in (({"conv_group_size": 7}, "conv_group_size"), ({"selector_top_k": 24}, "selector_top_k")):
        config = parse_config({**base, "train": {"drafter": "dflash2", "dflash2": {"mask_token_id": 16, **settings}}})
        with pytest.raises(ConfigError, match=rf"train\.dflash2\.{key}"):
            DFLASH2.spec(sizes, config)
