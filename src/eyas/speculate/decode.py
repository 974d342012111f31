"""The target-side loop of speculative decoding, as a serving engine runs it in chain mode.

One prefill of the prompt gives the first token and (for EAGLE-3) the aux hidden states of
every prompt position; then each round the proposer drafts up to k tokens, the target scores
the last committed token plus the drafts in one forward pass with its KV cache, the accepted
prefix and one target token are committed, the proposer is told the verified tokens and the
target's aux states at their positions, and the cache is cropped to the committed length.

Acceptance length τ = committed tokens ÷ verification passes (the bonus token counted, the
prefill not), as SGLang and vLLM report it. Plain greedy decoding runs through the same
:class:`TargetRunner` so its speed is the fair "without a drafter" figure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from eyas.speculate.sampling import sample_token, target_probs, verify_greedy, verify_sampled
from eyas.target.capture import AuxHooks


class Proposer(Protocol):
    """What the loop needs from a drafter; prompt lookup and EAGLE-3 both implement it."""

    name: str
    aux_layers: list[int] | None
    """Target layers whose outputs the proposer consumes (None: it needs no hidden states)."""

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new sequence."""

    def append(self, aux: torch.Tensor | None, next_tokens: list[int]) -> None:
        """Commit verified positions p..p+n-1: ``aux[j]`` the target's aux states at p+j,
        ``next_tokens[j]`` the token at p+j+1. Discards the last proposal's speculation."""

    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], list[torch.Tensor] | None]:
        """Up to k tokens continuing the committed ones (+ draft distributions when sampling)."""


class TargetRunner:
    """The target with a KV cache and forward hooks on the aux layers, one sequence at a time."""

    def __init__(self, model, aux_layers: list[int] | None = None):
        self.model = model
        self.cache = None
        self._hooks = AuxHooks(model, aux_layers) if aux_layers else None

    def close(self) -> None:
        if self._hooks is not None:
            self._hooks.close()

    def __enter__(self) -> TargetRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        # A sliding-window layer (Gemma-3, GPT-OSS) otherwise drops what leaves its window at each
        # forward, and a draft rejected once the window is full could not be cropped back out.
        self.cache.activate_past_recording()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def forward(self, ids: list[int], logits_to_keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append ``ids`` to the cache; return logits of the last ``logits_to_keep`` positions
        [n, V] (float32) and the aux states of all new positions [len(ids), 3H] (or None)."""
        device = self.model.device
        out = self.model(
            input_ids=torch.tensor([ids], device=device),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        aux = self._hooks.take()[0] if self._hooks is not None else None
        return out.logits[0].float(), aux

    def crop(self, length: int) -> None:
        """Drop cached positions beyond ``length`` (rejected drafts)."""
        # transformers 5.x: crop takes a negative count to remove; a positive value raises. Called
        # with nothing to remove too: that is what trims a recording sliding-window layer to its window.
        self.cache.crop(length - self.length)


@dataclass
class Decoded:
    tokens: list[int]
    """Generated ids (the end-of-turn token included when produced)."""
    passes: int
    """Target forward passes after the prefill."""
    seconds: float
    accepted_at: list[int] = field(default_factory=list)
    """accepted_at[i]: rounds whose draft at position i+1 was accepted."""

    @property
    def tau(self) -> float:
        # tokens[0] comes from the prefill; the rest from the verification passes.
        return (len(self.tokens) - 1) / self.passes if self.passes else 1.0


def _first_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature > 0:
        return sample_token(target_probs(logits[-1:], temperature)[0], generator)
    return int(logits[-1].argmax().item())


def greedy_decode(runner: TargetRunner, prompt: list[int], max_new_tokens: int, stop_ids: set[int]) -> Decoded:
    """Plain greedy decoding, one target pass per token: the reference output and speed."""
    started = time.perf_counter()
    runner.reset()
    logits, _ = runner.forward(prompt, 1)
    tokens = [int(logits[-1].argmax().item())]
    passes = 0
    while len(tokens) < max_new_tokens and tokens[-1] not in stop_ids:
        logits, _ = runner.forward(tokens[-1:], 1)
        passes += 1
        tokens.append(int(logits[-1].argmax().item()))
    return Decoded(tokens, passes, time.perf_counter() - started)


def speculative_decode(
    runner: TargetRunner,
    proposer: Proposer,
    prompt: list[int],
    k: int,
    max_new_tokens: int,
    stop_ids: set[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> Decoded:
    """Chain speculative decoding of one prompt; greedy verification when temperature is 0."""
    if temperature > 0 and generator is None:
        raise ValueError("sampling needs a torch.Generator for reproducible results")
    started = time.perf_counter()
    runner.reset()
    proposer.reset(prompt)
    logits, aux = runner.forward(prompt, 1)
    tokens = [_first_token(logits, temperature, generator)]
    proposer.append(aux, prompt[1:] + tokens)
    passes, accepted_at = 0, [0] * k
    while len(tokens) < max_new_tokens and tokens[-1] not in stop_ids:
        # A round commits at most drafts + 1 tokens; never draft past the budget.
        budget = min(k, max_new_tokens - len(tokens) - 1)
        drafts, draft_probs = proposer.propose(budget, temperature) if budget > 0 else ([], None)
        drafts = drafts[:budget]
        committed = runner.length
        logits, aux = runner.forward(tokens[-1:] + drafts, len(drafts) + 1)
        passes += 1
        if temperature > 0:
            m, last = verify_sampled(target_probs(logits, temperature), drafts, draft_probs, generator)
        else:
            m, last = verify_greedy(logits, drafts)
        for i in range(m):
            accepted_at[i] += 1
        new = drafts[:m] + [last]
        runner.crop(committed + m + 1)
        proposer.append(aux[: m + 1] if aux is not None else None, new)
        for token in new:
            tokens.append(token)
            if token in stop_ids or len(tokens) >= max_new_tokens:
                break
    return Decoded(tokens, passes, time.perf_counter() - started, accepted_at)
