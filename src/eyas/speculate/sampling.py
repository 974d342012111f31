"""Verification of proposed tokens against the target's logits: greedy and speculative sampling.

Both functions take the target's logits at the k+1 verified positions (the last committed
token followed by the k drafts) and return how many drafts are accepted and the one token the
target contributes after them (the correction on a rejection, the bonus when all pass).

Greedy: accept the longest prefix on which each draft equals the target's argmax, so the
output is exactly plain greedy decoding. Sampling (Leviathan et al. 2023, Chen et al. 2023):
accept draft d with probability min(1, p(d)/q(d)); on rejection sample from the normalised
residual max(0, p - q). The emitted tokens are then distributed exactly as the target's own
samples. A deterministic proposer (prompt lookup) has q = one-hot(d).
"""

from __future__ import annotations

import torch


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """``logits`` [k+1, V]; returns (accepted drafts m, target token after them)."""
    choices = logits.argmax(dim=-1).tolist()
    m = 0
    while m < len(drafts) and drafts[m] == choices[m]:
        m += 1
    return m, choices[m]


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The target's sampling distribution at each row (float32 for stable ratios)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def verify_sampled(
    probs: torch.Tensor,
    drafts: list[int],
    draft_probs: list[torch.Tensor] | None,
    generator: torch.Generator,
) -> tuple[int, int]:
    """``probs`` [k+1, V] target distributions; ``draft_probs[j]`` the proposer's q at draft j
    (None: a deterministic proposer). Returns (accepted drafts m, token sampled after them)."""
    for j, token in enumerate(drafts):
        p = probs[j]
        q_token = float(draft_probs[j][token]) if draft_probs is not None else 1.0
        u = torch.rand((), generator=generator).item()
        if q_token > 0 and u < min(1.0, float(p[token]) / q_token):
            continue
        if draft_probs is not None:
            residual = (p - draft_probs[j].to(p)).clamp_min(0)
        else:
            residual = p.clone()
            residual[token] = 0
        if float(residual.sum()) <= 0:
            # Only when p == q exactly, where rejection has probability zero; p is then the answer.
            residual = p
        return j, sample_token(residual, generator)
    return len(drafts), sample_token(probs[len(drafts)], generator)


def sample_token(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from unnormalised ``weights`` [V], on the CPU so one CPU generator serves any device."""
    weights = weights.detach().float().cpu()
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator).item())
