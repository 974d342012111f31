"""Drafter shapes for the embedded default and save/load round trips."""

from __future__ import annotations

import json

import torch

from eyas.config import TrainConfig
from eyas.drafter.families import load_drafter, save_drafter
from eyas.drafter.families.eagle3 import Eagle3Drafter, Eagle3Spec
from eyas.drafter.spec import spec_for_target
from eyas.target.capture import default_aux_layers
from tests.train.helpers import small_drafter


def test_default_shapes_for_embedded_target(model):
    spec = Eagle3Spec(
        **spec_for_target(model.config, TrainConfig(), default_aux_layers(30), draft_vocab_size=32000).sizes()
    )
    drafter = Eagle3Drafter(spec, model.get_input_embeddings().weight)
    shapes = {k: tuple(v.shape) for k, v in drafter.trainable_state_dict().items()}
    assert shapes == {
        "fc.weight": (576, 1728),
        "midlayer.self_attn.q_proj.weight": (576, 1152),
        "midlayer.self_attn.k_proj.weight": (192, 1152),
        "midlayer.self_attn.v_proj.weight": (192, 1152),
        "midlayer.self_attn.o_proj.weight": (576, 576),
        "midlayer.mlp.gate_proj.weight": (1536, 576),
        "midlayer.mlp.up_proj.weight": (1536, 576),
        "midlayer.mlp.down_proj.weight": (576, 1536),
        "midlayer.input_layernorm.weight": (576,),
        "midlayer.hidden_norm.weight": (576,),
        "midlayer.post_attention_layernorm.weight": (576,),
        "norm.weight": (576,),
        "lm_head.weight": (32000, 576),
        "d2t": (32000,),
        "t2d": (49152,),
    }
    assert spec.aux_layers == (1, 14, 26)
    assert spec.rope_parameters["rope_theta"] == 100000.0
    assert not drafter.embed_tokens.weight.requires_grad
    aux = torch.randn(2, 5, 3 * 576)
    ids = torch.randint(0, 49152, (2, 5))
    logits = list(drafter.unroll(aux, ids, steps=2))
    assert [tuple(x.shape) for x in logits] == [(2, 5, 32000)] * 2


def test_save_load_round_trip(model, tmp_path):
    drafter = small_drafter(model)
    save_drafter(drafter, tmp_path)
    loaded = load_drafter(tmp_path, model).eval()
    aux = torch.randn(1, 6, 3 * 576)
    ids = torch.randint(0, 49152, (1, 6))
    with torch.no_grad():
        for a, b in zip(drafter.unroll(aux, ids, 3), loaded.unroll(aux, ids, 3)):
            assert torch.equal(a, b)
    assert torch.equal(loaded.d2t, drafter.d2t) and torch.equal(loaded.t2d, drafter.t2d)


def test_eagle3_1_options_round_trip_through_every_layout_that_reads_them(model, tmp_path):
    """EAGLE-3.1 (train.eagle3): ``input_norm`` before ``fc`` and the post-norm state fed back, in
    the config keys vLLM and llama.cpp's converter read, and loaded back to the same drafter."""
    from eyas.drafter.families import EAGLE3, read_spec

    drafter = small_drafter(model, eagle3={"norm_before_fc": True, "norm_output": True})
    with torch.no_grad():
        drafter.input_norm.weight.uniform_(0.5, 1.5)
    save_drafter(drafter, tmp_path / "sglang")
    config = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert config["norm_before_fc"] is True and config["norm_output"] is True
    weights = drafter.trainable_state_dict()
    assert weights["input_norm.weight"].shape == (3 * 576,)
    EAGLE3.export("speculators", weights, drafter.spec, tmp_path / "speculators", torch.float32, ("embedded", []), 3)
    for layout in ("sglang", "speculators"):
        spec = read_spec(tmp_path / layout)
        assert (spec.norm_before_fc, spec.norm_output) == (True, True)

    loaded = load_drafter(tmp_path / "sglang", model).eval()
    plain = small_drafter(model)  # the same weights but for input_norm, as EAGLE-3
    aux, ids = torch.randn(1, 6, 3 * 576), torch.randint(0, 49152, (1, 6))
    with torch.no_grad():
        for a, b, c in zip(drafter.unroll(aux, ids, 3), loaded.unroll(aux, ids, 3), plain.unroll(aux, ids, 3)):
            assert torch.equal(a, b) and not torch.allclose(a, c)
    save_drafter(plain, tmp_path / "plain")
    assert not {"norm_before_fc", "norm_output"} & set(json.loads((tmp_path / "plain" / "config.json").read_text()))


def test_norm_before_residual_changes_the_layer_and_round_trips(model, tmp_path):
    """speculators' trainer's default: the attention's residual is the normed hidden state. Written
    where vLLM and llama.cpp's converter read it, read back, and a different function from the same
    weights without it."""
    from eyas.drafter.families import EAGLE3, read_spec

    drafter = small_drafter(model, eagle3={"norm_before_residual": True})
    with torch.no_grad():
        drafter.midlayer.hidden_norm.weight.uniform_(0.5, 1.5)
    weights = drafter.trainable_state_dict()
    save_drafter(drafter, tmp_path / "sglang")
    EAGLE3.export("speculators", weights, drafter.spec, tmp_path / "speculators", torch.float32, ("embedded", []), 3)
    for layout in ("sglang", "speculators"):
        assert json.loads((tmp_path / layout / "config.json").read_text())["norm_before_residual"] is True
        assert read_spec(tmp_path / layout).norm_before_residual
    loaded = load_drafter(tmp_path / "speculators", model).eval()
    plain = small_drafter(model)
    plain.load_state_dict(drafter.state_dict())
    aux, ids = torch.randn(1, 6, 3 * 576), torch.randint(0, 49152, (1, 6))
    with torch.no_grad():
        for a, b, c in zip(drafter.unroll(aux, ids, 3), loaded.unroll(aux, ids, 3), plain.unroll(aux, ids, 3)):
            assert torch.equal(a, b) and not torch.allclose(a, c)


def test_a_drafter_saved_by_speculators_own_trainer_loads_as_written(model, tmp_path):
    """speculators 0.9's trainer names its drafters ``Eagle3DraftModel``, writes RoPE only as
    transformers 5's ``rope_parameters`` and ``target_hidden_size: null``, and sets EAGLE-3.1's
    switches and ``norm_before_residual``: eyas refused the name, and read past it would have run
    RoPE at base 10,000 without the switches. ``fc_norm`` (once refused) is read too."""
    from eyas.drafter.families import EAGLE3, read_spec

    drafter = small_drafter(model, eagle3={"norm_before_fc": True, "norm_output": True, "norm_before_residual": True})
    EAGLE3.export("speculators", drafter.trainable_state_dict(), drafter.spec, tmp_path, torch.float32, ("t", []), 3)
    config = json.loads((tmp_path / "config.json").read_text())
    layer = config["transformer_layer_config"]
    theta = layer.pop("rope_theta")
    layer.pop("rope_scaling", None)
    layer["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    config |= {"architectures": ["Eagle3DraftModel"], "target_hidden_size": None, "fc_norm": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = read_spec(tmp_path)
    assert spec == drafter.spec
    assert spec.rope_parameters["rope_theta"] == 100000.0 and spec.target_hidden_size == 576

    (tmp_path / "config.json").write_text(json.dumps(config | {"fc_norm": True}))
    assert read_spec(tmp_path).fc_norm


def test_fc_norm_normalises_each_aux_state_on_its_own_and_round_trips(model, tmp_path):
    """EAGLE-3.1 as vLLM, SGLang and TensorRT-LLM serve it: one RMSNorm per aux state before
    ``fc`` (``fc_norm.{i}.weight``), so the layers' scales, orders of magnitude apart, no longer
    matter; written where vLLM reads it, read back, the same drafter."""
    from eyas.drafter.families import EAGLE3, read_spec

    drafter = small_drafter(model, eagle3={"fc_norm": True, "norm_output": True})
    with torch.no_grad():
        for norm in drafter.fc_norm:
            norm.weight.uniform_(0.5, 1.5)
    weights = drafter.trainable_state_dict()
    assert all(weights[f"fc_norm.{i}.weight"].shape == (576,) for i in range(3))
    save_drafter(drafter, tmp_path / "sglang")
    EAGLE3.export("speculators", weights, drafter.spec, tmp_path / "speculators", torch.float32, ("embedded", []), 3)
    for layout in ("sglang", "speculators"):
        assert json.loads((tmp_path / layout / "config.json").read_text())["fc_norm"] is True
        assert read_spec(tmp_path / layout) == drafter.spec

    aux = torch.randn(1, 6, 3 * 576)
    scaled = aux.clone()
    scaled[..., :576] *= 1000.0  # one layer's state a thousand times larger
    with torch.no_grad():
        assert torch.allclose(drafter.fuse(aux), drafter.fuse(scaled), atol=1e-4)
        with_one_norm = small_drafter(model, eagle3={"norm_before_fc": True, "norm_output": True})
        assert not torch.allclose(with_one_norm.fuse(aux), with_one_norm.fuse(scaled), atol=1e-2)
    loaded = load_drafter(tmp_path / "speculators", model).eval()
    ids = torch.randint(0, 49152, (1, 6))
    with torch.no_grad():
        for a, b in zip(drafter.unroll(aux, ids, 3), loaded.unroll(aux, ids, 3)):
            assert torch.equal(a, b)
