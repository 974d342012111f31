"""Warm start (train.init_from): a finished drafter seeds a run with another draft vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eyas import train
from eyas.config import ConfigError
from eyas.drafter.families import read_drafter
from eyas.drafter.families.eagle3 import Eagle3Drafter, Eagle3Spec
from eyas.drafter.spec import spec_for_target
from eyas.paths import RunPaths
from eyas.stage import check
from eyas.target import aux_layers, text_config
from eyas.train.warm_start import warm_start

from .conftest import load_tiny, write_merged

STEPS = 4


def fresh_drafter(model, config, draft_vocab: int) -> Eagle3Drafter:
    """A drafter as training builds it before the warm start: random weights, this run's vocabulary."""
    layers = aux_layers(config.target, config.extract.aux_layers)
    spec = Eagle3Spec(**spec_for_target(text_config(model.config), config.train, layers, draft_vocab).sizes())
    drafter = Eagle3Drafter(spec, model.get_input_embeddings().weight)
    used = torch.arange(10, 10 + 2 * draft_vocab, 2)  # every other id: half of a smaller vocabulary's ids
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[used] = True
    drafter.set_vocab(used - torch.arange(draft_vocab), t2d)
    return drafter


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, corpus_rows):
    run = write_merged(tmp_path_factory.mktemp("source") / "run", *corpus_rows)
    config = load_tiny(run, max_steps=STEPS, epochs=100, tau_prompts=0)
    train.run(config, quiet=True)
    return config


def test_every_weight_is_carried_and_lm_head_rows_follow_the_vocabulary(source_run, model):
    source = RunPaths.of(source_run).train_final
    spec, weights = read_drafter(source)
    config = load_tiny(source_run.run_dir, draft_vocab_size=128)
    drafter = fresh_drafter(model, config, 128)
    fresh_head = drafter.lm_head.weight.detach().clone()
    carried = warm_start(drafter, source, 30)
    mine = drafter.trainable_state_dict()
    for name, value in weights.items():
        if name not in ("lm_head.weight", "d2t", "t2d"):
            assert torch.equal(mine[name], value.to(mine[name].dtype)), name
    source_row = {int(t): r for r, t in enumerate(torch.arange(spec.draft_vocab_size) + weights["d2t"])}
    shared = 0
    for row, target_id in enumerate(drafter.to_target_ids(torch.arange(128)).tolist()):
        if target_id in source_row:
            shared += 1
            assert torch.equal(mine["lm_head.weight"][row], weights["lm_head.weight"][source_row[target_id]].float())
        else:
            assert torch.equal(mine["lm_head.weight"][row], fresh_head[row])
    assert 0 < shared < 128 and carried == {"carried_rows": shared, "new_rows": 128 - shared}


def test_a_drafter_of_another_shape_is_refused_by_name(source_run, model):
    config = load_tiny(source_run.run_dir, intermediate_size=64)
    with pytest.raises(ConfigError, match=r"train.init_from: .* intermediate_size 128 there, 64 here \(set train"):
        warm_start(fresh_drafter(model, config, 128), RunPaths.of(source_run).train_final, 30)
    with pytest.raises(ConfigError, match="train.init_from: .*not a drafter directory"):
        warm_start(fresh_drafter(model, config, 128), Path(source_run.run_dir), 30)


def test_a_warm_started_run_trains_and_goes_stale_when_its_source_changes(tmp_path, source_run, corpus_rows):
    source = RunPaths.of(source_run).train_final
    run = write_merged(tmp_path / "run", *corpus_rows)
    config = load_tiny(run, max_steps=2, epochs=100, tau_prompts=0, init_from=str(source), draft_vocab_size=128)
    result = train.run(config, quiet=True)
    assert result["step"] == 2
    paths = RunPaths.of(config)
    assert check(config, train.CONTRACT, paths).status == "current"
    retrained = load_tiny(source_run.run_dir, max_steps=STEPS + 1, epochs=100, tau_prompts=0)
    train.run(retrained, quiet=True)  # the source drafter continues: new weights in the same place
    state = check(config, train.CONTRACT, paths)
    assert state.status == "stale" and "train.init_from" in state.why
