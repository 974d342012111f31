"""EAGLE-3 inside the verification loop: lossless, and the broken-aux control collapses.

The control is the reference job's bug: aux hidden states concatenated in the wrong order. A
drafter that has learned to use its inputs must lose most of its acceptance with them.
"""

from __future__ import annotations

import pytest
import torch

from eyas.eval.decode import TargetRunner, speculative_decode
from eyas.eval.eagle import BROKEN_ORDER, EagleProposer
from eyas.eval.lookup import PromptLookup

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
    real = _tau(model, EagleProposer(drafter), prompts, greedy, stop)
    broken = _tau(model, EagleProposer(drafter, "broken", BROKEN_ORDER), prompts, greedy, stop)
    lookup = _tau(model, PromptLookup(), prompts, greedy, stop)
    print(f"tau: drafter {real:.2f}, broken {broken:.2f}, prompt lookup {lookup:.2f}")
    assert real >= 2.0
    # The control keeps less than half of what the drafter gains over one token per pass.
    assert broken - 1.0 < (real - 1.0) / 2


@pytest.mark.slow
def test_drafter_sampling_is_reproducible(model, overfit):
    prompts, _, stop, drafter = overfit

    def sample():
        torch.manual_seed(0)
        with TargetRunner(model, drafter.spec.aux_layers) as runner:
            g = torch.Generator().manual_seed(0)
            return speculative_decode(runner, EagleProposer(drafter), prompts[0], 3, MAX_NEW, stop, 0.7, g)

    first, second = sample(), sample()
    assert first.tokens == second.tokens and first.passes == second.passes
    assert first.tau > 1.0
