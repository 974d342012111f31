"""Verification rules on toy distributions: greedy prefix matching and exact rejection sampling."""

from __future__ import annotations

import torch

from eyas.speculate.sampling import verify_greedy, verify_sampled


def test_greedy_accepts_the_matching_prefix_and_adds_the_target_token():
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([3, 5, 7, 9]):
        logits[row, best] = 1.0
    assert verify_greedy(logits, [3, 5, 7]) == (3, 9)
    assert verify_greedy(logits, [3, 6, 7]) == (1, 5)
    assert verify_greedy(logits, [4, 5, 7]) == (0, 3)
    assert verify_greedy(logits[:1], []) == (0, 3)


def _first_token_histogram(p, q, trials: int, deterministic: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(p))
    probs = torch.stack([p, p])
    for _ in range(trials):
        if deterministic:
            draft = 2
            m, last = verify_sampled(probs, [draft], None, generator)
        else:
            draft = int(torch.multinomial(q, 1, generator=generator).item())
            m, last = verify_sampled(probs, [draft], [q], generator)
        counts[draft if m == 1 else last] += 1
    return counts / trials


def test_rejection_sampling_reproduces_the_target_distribution():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    freq = _first_token_histogram(p, q, 6000, deterministic=False)
    assert torch.allclose(freq, p, atol=0.025), freq


def test_rejection_sampling_with_a_deterministic_proposer_is_exact():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    freq = _first_token_histogram(p, None, 6000, deterministic=True)
    assert torch.allclose(freq, p, atol=0.025), freq


def test_a_draft_the_target_never_samples_is_always_rejected():
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = [torch.tensor([0.0, 0.0, 1.0])]
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        m, last = verify_sampled(p, [2], q, generator)
        assert m == 0 and last in (0, 1)
