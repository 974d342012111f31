"""Prompt-lookup (n-gram) proposer: the baseline a drafter has to beat.

Proposes the tokens that followed the most recent earlier occurrence of the last n tokens
(n from ``max_ngram`` down to ``min_ngram``) in the prompt and the text generated so far —
what vLLM's ``ngram`` method and transformers' ``prompt_lookup_num_tokens`` do. It costs no
model at all, so a drafter that does not beat it is not worth serving.
"""

from __future__ import annotations

import torch


class PromptLookup:
    """Implements the :class:`~eyas.speculate.decode.Proposer` protocol from token history alone."""

    name = "prompt_lookup"
    aux_layers = None

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []

    def reset(self, prompt_ids: list[int]) -> None:
        self.tokens = list(prompt_ids)

    def append(self, aux: torch.Tensor | None, next_tokens: list[int]) -> None:
        self.tokens.extend(next_tokens)

    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], None]:
        tokens = self.tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            pattern = tokens[-n:]
            # Latest match first: recent text predicts what comes next best.
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == pattern:
                    return tokens[start + n : start + n + k], None
        return [], None
