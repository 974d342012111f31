"""EAGLE-3 inside the verification loop: lossless, and the broken-aux control collapses.

The control is the reference job's bug: aux hidden states concatenated in the wrong order. A
drafter that has learned to use its inputs must lose most of its acceptance with them.
"""

from __future__ import annotations

import pytest
import torch

from eyas.drafter.families import load_drafter, save_drafter
from eyas.speculate.decode import TargetRunner, speculative_decode
from eyas.speculate.drafter import BROKEN_ORDER, DrafterProposer
from eyas.speculate.lookup import PromptLookup

from .overfit import OVERFIT_NEW as MAX_NEW


def _tau(model, proposer, prompts, greedy, stop, k=3):
    generated = passes = 0
    with TargetRunner(model, proposer.aux_layers) as runner:
        for prompt, reference in zip(prompts, greedy):
            out = speculative_decode(runner, proposer, prompt, k, MAX_NEW, stop)
            assert out.tokens == reference, "speculative output differs from greedy decoding"
            generated += len(out.tokens) - 1
            passes += out.passes
    return generated / passes


@pytest.mark.slow
def test_broken_aux_order_collapses_tau_toward_one(model, overfit):
    prompts, greedy, stop, drafter = overfit
    real = _tau(model, DrafterProposer(drafter), prompts, greedy, stop)
    broken = _tau(model, DrafterProposer(drafter, "broken", BROKEN_ORDER), prompts, greedy, stop)
    lookup = _tau(model, PromptLookup(), prompts, greedy, stop)
    print(f"tau: drafter {real:.2f}, broken {broken:.2f}, prompt lookup {lookup:.2f}")
    assert real >= 2.0
    # The control keeps less than half of what the drafter gains over one token per pass.
    assert broken - 1.0 < (real - 1.0) / 2


@pytest.mark.slow
@pytest.mark.parametrize("sample_drafts", [False, True], ids=["greedy-drafts", "sampled-drafts"])
def test_drafter_sampling_is_reproducible(model, overfit, sample_drafts):
    prompts, _, stop, drafter = overfit

    def sample():
        torch.manual_seed(0)
        with TargetRunner(model, drafter.spec.aux_layers) as runner:
            g = torch.Generator().manual_seed(0)
            proposer = DrafterProposer(drafter, sample_drafts=sample_drafts)
            return speculative_decode(runner, proposer, prompts[0], 3, MAX_NEW, stop, 0.7, g)

    first, second = sample(), sample()
    assert first.tokens == second.tokens and first.passes == second.passes
    assert first.tau > 1.0


def _misnumbered_copy(drafter, directory):
    """The drafter saved as eyas wrote exports before the numbering fix: output-layer ids at the
    top level, where vLLM reads "the state entering layer k", and no eagle_config."""
    import json

    save_drafter(drafter, directory)
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["eagle_aux_hidden_state_layer_ids"] = config.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
    path.write_text(json.dumps(config))
    return directory


def test_an_export_read_with_shifted_layer_ids_loses_acceptance(tmp_path):
    """The check that would have caught the off-by-one: the same weights, read with layer ids one
    lower, must accept less. On SmolLM2 adjacent layers are so alike that a drafter overfit on three
    prompts barely notices (the demo drafter lost 1.51 -> 1.45); a small target whose layers each
    move the residual stream a lot (init std 1.0) makes the loss plain, as on large targets."""
    from eyas.speculate.decode import greedy_decode

    from .overfit import distinct_layers_target, overfit_drafter

    target = distinct_layers_target(512)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 512, (12,), generator=generator).tolist() for _ in range(3)]
    stop = {0}
    with TargetRunner(target) as runner:
        greedy = [greedy_decode(runner, p, MAX_NEW, stop).tokens for p in prompts]
    drafter = overfit_drafter(target, [p + g for p, g in zip(prompts, greedy)], steps=60)
    shifted = load_drafter(_misnumbered_copy(drafter, tmp_path / "shifted"), target)
    assert list(shifted.spec.aux_layers) == [i - 1 for i in drafter.spec.aux_layers]
    real = _tau(target, DrafterProposer(drafter), prompts, greedy, stop)
    misread = _tau(target, DrafterProposer(shifted), prompts, greedy, stop)
    print(f"tau: layers as trained {real:.2f}, read one lower {misread:.2f}")
    assert misread < real - 1.0


def test_greedy_drafts_at_temperature_are_the_argmax_with_one_hot_q(model, overfit):
    """vLLM drafts the argmax and accepts it with the target's probability: q is one-hot (None)."""
    prompts, greedy, _, drafter = overfit
    proposer = DrafterProposer(drafter)
    with TargetRunner(model, proposer.aux_layers) as runner:
        runner.reset()
        proposer.reset(prompts[0])
        _, aux = runner.forward(prompts[0], 1)
        proposer.append(aux, prompts[0][1:] + greedy[0][:1])
        assert proposer.propose(3, 0.7) == (proposer.propose(3, 0.0)[0], None)
