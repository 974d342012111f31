"""A drafter overfit on three prompts (seconds), shared by the eval tests."""

from __future__ import annotations

import pytest

from eyas.speculate.decode import TargetRunner, greedy_decode

from .overfit import OVERFIT_NEW, TEXTS, overfit_dflash, overfit_drafter


@pytest.fixture(scope="session")
def overfit(model, tokenizer):
    """(prompt ids, greedy continuations, stop ids, drafter trained on exactly those)."""
    stop = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for t in TEXTS
    ]
    with TargetRunner(model) as runner:
        greedy = [greedy_decode(runner, p, OVERFIT_NEW, stop).tokens for p in prompts]
    drafter = overfit_drafter(model, [p + g for p, g in zip(prompts, greedy)])
    return prompts, greedy, stop, drafter


@pytest.fixture(scope="session")
def overfit_dflash_drafter(model, overfit):
    """A DFlash drafter (block size 4) trained on the same three continuations."""
    prompts, greedy, _, _ = overfit
    return overfit_dflash(model, prompts, greedy)


@pytest.fixture(scope="session")
def overfit_dspark_drafter(model, overfit):
    """A DSpark drafter (block size 4, reduced vocabulary, confidence head) trained on the same three continuations."""
    prompts, greedy, _, _ = overfit
    return overfit_dflash(model, prompts, greedy, family="dspark")


@pytest.fixture(scope="session")
def overfit_dflash2_drafter(model, overfit):
    """A DFlash2 drafter (block size 4, two-tap convolutions, selector of rank 32 over the top 8) trained on the same three continuations."""
    prompts, greedy, _, _ = overfit
    return overfit_dflash(model, prompts, greedy, family="dflash2")
