"""DSpark drafters: the block training scores is the chain drafting runs (Markov head and
confidence included), the layout llama.cpp's converter and vLLM read, and the objective's
confidence target."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import eyas.train
from eyas.config import ConfigError, TrainConfig, parse_config
from eyas.drafter.families import DSPARK, family_at, load_drafter, read_drafter, save_drafter
from eyas.drafter.families.dflash import dflash_spec
from eyas.drafter.families.dspark import DSparkDrafter, DSparkObjective, DSparkSession, DSparkSpec
from eyas.drafter.layout import CONFIG_FILE
from eyas.drafter.spec import spec_for_target
from eyas.pipeline import preflight
from eyas.target.capture import capture, default_aux_layers, num_decoder_layers
from eyas.train.data import Batch
from eyas.train.metrics import read_metrics
from tests.train.conftest import copy_run, load_tiny

DRAFT_VOCAB = 600


def random_dspark(model, draft_vocab: int | None = DRAFT_VOCAB, block_size: int = 4, confidence: bool = True):
    """A random DSpark drafter on the embedded target, over the ``draft_vocab`` lowest ids plus
    every other id above them (None: the full vocabulary)."""
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    train = TrainConfig(intermediate_size=128, dflash={"layers": 2, "block_size": block_size})
    base = spec_for_target(model.config, train, default_aux_layers(num_decoder_layers(model)), vocab)
    block = dflash_spec(base, train.dflash, 16)
    spec = DSparkSpec(
        **(block.sizes() | {"draft_vocab_size": draft_vocab or vocab}),
        num_layers=2,
        block_size=block_size,
        mask_token_id=16,
        markov_rank=32,
        confidence_head=confidence,
    )
    drafter = DSparkDrafter(spec, model.get_input_embeddings().weight, model.lm_head.weight)
    if spec.reduced:
        used = torch.cat([torch.arange(draft_vocab // 2), torch.arange(draft_vocab // 2, vocab, 2)[: draft_vocab // 2]])
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[used] = True
        drafter.set_vocab(used - torch.arange(draft_vocab), t2d)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.requires_grad and p.ndim == 2:
                p.normal_(0, 0.5) if name.startswith("markov_head") else p.mul_(3.0)
    return drafter.eval()


@pytest.mark.parametrize("draft_vocab", [DRAFT_VOCAB, None], ids=["reduced vocabulary", "full vocabulary"])
def test_a_training_block_is_the_chain_drafting_runs(model, tokenizer, draft_vocab):
    """Drafting chains each position on the token drafted before it; training feeds the true one.
    Where the true tokens are the drafted ones, the two give the same logits and confidences."""
    drafter = random_dspark(model, draft_vocab)
    ids = torch.tensor(
        [tokenizer("Speculative decoding drafts tokens that the target then checks in one pass.")["input_ids"]]
    )
    features = capture(model, ids, aux_layers=list(drafter.spec.aux_layers)).aux
    size = drafter.spec.block_size
    for a in (3, 7):
        session = DSparkSession(drafter)
        session.append(features[0, :a], ids[0, 1 : a + 1])
        tokens, logits, confidences = session.chain(size)
        assert len(tokens) == size, "every block position drafts"
        assert session.propose(size + 2) == (tokens, None), "never more than block_size"
        # The sequence as drafted: the block only sees the context before a, which is unchanged.
        drafted = ids.clone()
        drafted[0, a + 1 : a + 1 + size] = torch.tensor(tokens)
        with torch.no_grad():
            trained, confidence = drafter.blocks(features, drafted, torch.tensor([[a]]))
        assert torch.allclose(trained[0, 0], torch.stack(logits), atol=1e-4)
        assert torch.allclose(torch.sigmoid(confidence[0, 0]), torch.tensor(confidences), atol=1e-5)
        assert all(drafter.t2d[t] for t in tokens) if drafter.spec.reduced else True


def test_the_dspark_layout_is_what_llamacpp_and_vllm_read(model, tmp_path):
    drafter = random_dspark(model)
    save_drafter(drafter, tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["sample_from_anchor"] is True
    assert config["dflash_config"] == {"mask_token_id": 16, "target_layer_ids": [1, 14, 26], "block_size": 4}
    assert (config["markov_rank"], config["markov_head_type"], config["draft_vocab_size"]) == (32, "vanilla", 600)
    assert config["enable_confidence_head"] is True and config["confidence_head_with_markov"] is True
    assert not {"aux_hidden_state_layer_ids", "transformer_layer_config"} & set(config), "the speculators layout"
    weights = load_file(str(tmp_path / "model.safetensors"))
    h, v = drafter.spec.hidden_size, drafter.spec.vocab_size
    assert weights["markov_head.markov_w1.weight"].shape == (v, 32)
    assert weights["markov_head.markov_w2.weight"].shape == (DRAFT_VOCAB, 32)
    assert weights["confidence_head.proj.weight"].shape == (1, h + 32) and weights[
        "confidence_head.proj.bias"
    ].shape == (1,)
    assert weights["lm_head.weight"].shape == (DRAFT_VOCAB, h) and weights["d2t"].dtype == torch.int64
    assert not any(k.startswith(("embed_tokens", "target_head")) for k in weights), "the target's own"
    spec, read = read_drafter(tmp_path)
    assert spec == drafter.spec and family_at(tmp_path) is DSPARK
    loaded = load_drafter(tmp_path, model)
    assert isinstance(loaded, DSparkDrafter)
    assert all(torch.equal(loaded.trainable_state_dict()[k], v) for k, v in drafter.trainable_state_dict().items())

    full = random_dspark(model, None, confidence=False)
    save_drafter(full, tmp_path / "full")
    weights = load_file(str(tmp_path / "full" / "model.safetensors"))
    assert not {"lm_head.weight", "d2t", "confidence_head.proj.weight"} & set(weights), "the target's head serves"
    # llama.cpp cuts a DSpark draft by its confidence head: with none, llama-server refuses any threshold.
    assert DSPARK.llamacpp_p_mins(drafter.spec, [0.0, 0.5]) == [0.0, 0.5]
    assert DSPARK.llamacpp_p_mins(full.spec, [0.0, 0.5]) == [0.0]


def test_the_confidence_head_learns_the_acceptance_rate_of_its_position(model, tokenizer):
    """Every position is scored (block_size of them); the confidence loss pulls sigmoid(c) to
    1 − ½‖p_draft − p_target‖₁, so on a drafter that copies the target's head it heads for 1."""
    drafter = random_dspark(model, None).train()
    ids = torch.tensor([tokenizer("The sky is blue because air scatters short wavelengths more.")["input_ids"]])
    captured = capture(model, ids, aux_layers=list(drafter.spec.aux_layers))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 4:] = True
    batch = Batch(ids, mask, captured.aux.clone(), captured.final.clone(), int(mask.sum()))
    vocab = model.config.vocab_size
    objective = DSparkObjective(8, 4, torch.arange(vocab), torch.ones(vocab, dtype=torch.bool), 1.0)
    stats = objective.stats(drafter, drafter, batch, [0])
    assert len(stats) == objective.positions == 4
    assert all(torch.isfinite(s.loss_sum) for s in stats) and int(stats[0].loss_count) > 0
    sum(s.loss_sum for s in stats).backward()
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight"):
        assert dict(drafter.named_parameters())[name].grad.abs().sum() > 0, name


def test_dspark_settings_that_cannot_work_are_refused_by_key(tmp_path):
    base = {"run_dir": str(tmp_path), "target": {"device": "cpu"}}
    with pytest.raises(ConfigError, match=r"train\.init_from: .*a DSpark drafter trains from random weights"):
        preflight(parse_config({**base, "train": {"drafter": "dspark", "init_from": "elsewhere"}}))
    with pytest.raises(ConfigError, match=r"train\.dspark\.markov_rank"):
        parse_config({**base, "train": {"drafter": "dspark", "dspark": {"markov_rank": 0}}})


@pytest.mark.slow
def test_a_dspark_run_trains_over_its_draft_vocabulary_and_resumes_bit_for_bit(merged_run, tmp_path):
    """Through the train stage: the draft vocabulary counted from the answers (d2t in the drafter),
    one figure per block position, its own learning rate, and an exact resume."""
    other = copy_run(merged_run, tmp_path / "resumed")
    settings = {
        "drafter": "dspark",
        "draft_vocab_size": 512,
        "dspark": {"block_size": 3, "anchors": 4, "markov_rank": 16, "lr": 3e-3},
        "lr": 1e-4,
        "max_steps": 4,
        "epochs": 10.0,
        "checkpoint_every": 2,
        "tau_prompts": 1,
        "eval_every": 2,
    }
    eyas.train.run(load_tiny(merged_run, **settings), quiet=True)
    straight = read_metrics(merged_run / "train" / "metrics.jsonl")
    assert all(len(r["acc"]) == 3 for r in straight if r["split"] == "train"), "every block position drafts"
    assert max(r["lr"] for r in straight if r["split"] == "train") > 1e-3, "DSpark trains at train.dspark.lr"
    final = merged_run / "train" / "final"
    spec, weights = read_drafter(final)
    assert family_at(final) is DSPARK and spec.draft_vocab_size == 512 and weights["d2t"].shape == (512,)

    eyas.train.run(load_tiny(other, **settings), quiet=True, stop_after=3)
    shutil.rmtree(other / "train" / "checkpoints" / "step-00000003")
    eyas.train.run(load_tiny(other, **settings), quiet=True)
    resumed = read_metrics(other / "train" / "metrics.jsonl")
    rows = [(r["step"], r["loss"], r["lr"]) for r in straight if r["split"] == "train"]
    assert rows == [(r["step"], r["loss"], r["lr"]) for r in resumed if r["split"] == "train"]
    again = load_file(str(other / "train" / "final" / "model.safetensors"))
    assert again.keys() == weights.keys() and all(torch.equal(again[k], weights[k]) for k in weights)
