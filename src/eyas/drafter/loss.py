"""The training-time-test loss and accuracy, with the shifts in one place.

At TTT step k, drafter row t sees token x_{t+1+k} and predicts the target's distribution at
position p = t+1+k, i.e. the token x_{p+1}. That prediction counts when x_{p+1} is an answer
token (``loss_mask[p+1] == 1``): shifting the mask with the inputs this way keeps the first
answer token, which public trainers that test ``loss_mask[p]`` drop. The loss also skips
positions whose target argmax lies outside the draft vocabulary (the restricted target would
teach the wrong token there); accuracy keeps them, as a miss, because serving would too.

Sums and counts come back separately so data-parallel ranks can divide by the *global*
count: the gradient is then the same as one process on the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Targets:
    probs: torch.Tensor
    """[B,T,V_draft] float32: the target's softmax restricted to the draft vocabulary, renormalised."""
    argmax: torch.Tensor
    """[B,T] target ids: the target's greedy token at each position."""
    in_vocab: torch.Tensor
    """[B,T] bool: the target's argmax is in the draft vocabulary."""


@torch.no_grad()
def target_distribution(
    final: torch.Tensor,
    lm_head: torch.Tensor,
    used: torch.Tensor,
    t2d: torch.Tensor,
    needed: torch.Tensor,
    rows_per_chunk: int = 512,
) -> Targets:
    """Target outputs at the positions marked ``needed`` only (the full-vocabulary product
    is the costliest part of a CPU step, and prompt positions never carry loss)."""
    b, t, _ = final.shape
    probs = torch.zeros(b, t, used.shape[0], device=final.device)
    argmax = torch.zeros(b, t, dtype=torch.long, device=final.device)
    where = needed.nonzero(as_tuple=True)
    rows = final[where].to(lm_head.dtype)
    for start in range(0, rows.shape[0], rows_per_chunk):
        chunk = (rows[start : start + rows_per_chunk] @ lm_head.T).float()
        index = tuple(w[start : start + rows_per_chunk] for w in where)
        argmax[index] = chunk.argmax(-1)
        probs[index] = torch.softmax(chunk[:, used], dim=-1)
    return Targets(probs=probs, argmax=argmax, in_vocab=t2d[argmax])


def needed_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions p whose target distribution some step uses: those followed by an answer token."""
    return F.pad(loss_mask[:, 1:], (0, 1), value=False)


@dataclass
class StepStats:
    """One TTT step over a (local) batch."""

    loss_sum: torch.Tensor
    loss_count: torch.Tensor
    correct: torch.Tensor
    scored: torch.Tensor


def shifted(x: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """x[:, t + by] at row t, ``fill`` past the end."""
    return F.pad(x[:, by:], (0, by) if x.ndim == 2 else (0, 0, 0, by), value=fill)


def step_stats(
    logits: torch.Tensor, step: int, loss_mask: torch.Tensor, targets: Targets, d2t: torch.Tensor
) -> StepStats:
    """Soft cross-entropy sum and top-1 hits of step ``step``'s logits [B,T,V_draft]."""
    answer = shifted(loss_mask, step + 2, False)
    probs = shifted(targets.probs, step + 1)
    trained = answer & shifted(targets.in_vocab, step + 1, False)
    logp = torch.log_softmax(logits.float(), dim=-1)
    loss = -(probs * logp).sum(-1)
    draft = logits.argmax(-1)
    hits = (draft + d2t[draft]) == shifted(targets.argmax, step + 1)
    return StepStats(
        loss_sum=(loss * trained).sum(),
        loss_count=trained.sum(),
        correct=(hits & answer).sum(),
        scored=answer.sum(),
    )


def acceptance_length(accuracies: list[float]) -> float:
    """Simulated acceptance length 1 + Σₖ Πᵢ≤ₖ accᵢ (the 1 is the target's bonus token)."""
    total, running = 1.0, 1.0
    for acc in accuracies:
        running *= acc
        total += running
    return total
