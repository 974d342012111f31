"""The verification loop on the real embedded target: lossless, τ accounting, aux states."""

from __future__ import annotations

import pytest
import torch

from eyas.speculate.decode import TargetRunner, greedy_decode, speculative_decode
from eyas.speculate.lookup import PromptLookup
from eyas.target import end_of_turn_id
from eyas.target.capture import capture, default_aux_layers, num_decoder_layers

MAX_NEW = 16


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = ["Repeat after me: red green blue red green blue red green", "What is two plus two?"]
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for t in texts
    ]


@pytest.fixture(scope="module")
def greedy(model, tokenizer, prompts):
    with TargetRunner(model) as runner:
        return [greedy_decode(runner, p, MAX_NEW, {end_of_turn_id(tokenizer)}) for p in prompts]


class Oracle:
    """Proposes a known continuation (optionally corrupted); records the aux it is given."""

    name = "oracle"

    def __init__(self, continuation: list[int], aux_layers, wrong: bool = False):
        self.continuation, self.aux_layers, self.wrong = continuation, aux_layers, wrong
        self.aux: list[torch.Tensor] = []

    def reset(self, prompt_ids):
        self.done = 0

    def append(self, aux, next_tokens):
        self.aux.append(aux)
        self.done += len(next_tokens) if self.aux[1:] else 1

    def propose(self, k, temperature=0.0):
        drafts = self.continuation[self.done : self.done + k]
        return ([t + 1 for t in drafts] if self.wrong else drafts), None


def test_prompt_lookup_output_equals_plain_greedy(model, tokenizer, prompts, greedy):
    with TargetRunner(model) as runner:
        for prompt, reference in zip(prompts, greedy):
            out = speculative_decode(runner, PromptLookup(), prompt, 3, MAX_NEW, {end_of_turn_id(tokenizer)})
            assert out.tokens == reference.tokens
            assert out.tau >= 1.0
            assert out.tau == pytest.approx((len(out.tokens) - 1) / out.passes)


def test_a_perfect_proposer_gets_k_plus_one_tokens_per_pass_and_the_right_aux(model, tokenizer, prompts, greedy):
    layers = default_aux_layers(num_decoder_layers(model))
    prompt, reference = prompts[1], greedy[1].tokens
    oracle = Oracle(reference, layers)
    with TargetRunner(model, layers) as runner:
        out = speculative_decode(runner, oracle, prompt, 3, MAX_NEW, set())
    assert out.tokens == reference
    assert out.passes == -(-(MAX_NEW - 1) // 4)  # 15 tokens after the first, 4 per pass
    assert out.accepted_at[0] == out.passes
    # The aux states handed over are the target's at exactly the committed positions.
    seq = torch.tensor([prompt + reference])
    expected = capture(model, seq, aux_layers=layers).aux[0]
    given = torch.cat(oracle.aux)
    assert given.shape[0] == len(prompt) + len(reference) - 1
    assert torch.allclose(given, expected[: given.shape[0]], atol=1e-3)


def test_a_proposer_that_is_always_wrong_gets_tau_one(model, prompts, greedy):
    with TargetRunner(model) as runner:
        out = speculative_decode(runner, Oracle(greedy[1].tokens, None, wrong=True), prompts[1], 3, MAX_NEW, set())
    assert out.tokens == greedy[1].tokens
    assert out.tau == 1.0 and out.accepted_at == [0, 0, 0]


def test_sampling_is_reproducible_and_differs_across_seeds(model, prompts):
    def sample(seed):
        with TargetRunner(model) as runner:
            g = torch.Generator().manual_seed(seed)
            return speculative_decode(runner, PromptLookup(), prompts[0], 3, MAX_NEW, set(), 1.0, g).tokens

    first = sample(0)
    assert sample(0) == first and len(first) == MAX_NEW
    assert any(sample(s) != first for s in (1, 2, 3))


@pytest.mark.parametrize("name", ["Gemma-3", "GPT-OSS"])
def test_rejected_drafts_are_cropped_past_a_sliding_window(name, tokenizer, prompts, tmp_path):
    """A target with sliding-window layers, decoded well past its window with drafts that are
    always rejected (every pass crops the cache): the output is still plain greedy decoding's."""
    from transformers import AutoModelForCausalLM

    from tests.tiny_targets import build_target

    target = AutoModelForCausalLM.from_pretrained(build_target(name, tokenizer, tmp_path / name)).eval()
    window = target.config.sliding_window
    assert len(prompts[0]) + MAX_NEW > window
    with TargetRunner(target) as runner:
        reference = greedy_decode(runner, prompts[0], MAX_NEW, set())
        out = speculative_decode(runner, Oracle(reference.tokens[1:], None, wrong=True), prompts[0], 3, MAX_NEW, set())
    assert out.tokens == reference.tokens and out.passes == MAX_NEW - 1
