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

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eyas.drafter.criteria import Criterion


@dataclass
class Targets:
    logp: torch.Tensor
    """[B,T,V_draft] float32: the target's log-softmax restricted to the draft vocabulary,
    renormalised (uniform at positions no step uses, so every divergence stays finite there)."""
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
    logp = torch.full((b, t, used.shape[0]), -math.log(used.shape[0]), device=final.device)
    argmax = torch.zeros(b, t, dtype=torch.long, device=final.device)
    where = needed.nonzero(as_tuple=True)
    rows = final[where].to(lm_head.dtype)
    for start in range(0, rows.shape[0], rows_per_chunk):
        chunk = (rows[start : start + rows_per_chunk] @ lm_head.T).float()
        index = tuple(w[start : start + rows_per_chunk] for w in where)
        argmax[index] = chunk.argmax(-1)
        logp[index] = torch.log_softmax(chunk[:, used], dim=-1)
    return Targets(logp=logp, argmax=argmax, in_vocab=t2d[argmax])


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


def ttt_stats(
    step_logits: list[torch.Tensor], loss_mask: torch.Tensor, targets: Targets, d2t: torch.Tensor, criterion: Criterion
) -> list[StepStats]:
    """Per TTT step, the sums of ``criterion``'s loss and the top-1 hits of its logits [B,T,V_draft].
    Row t's steps are one chain of drafts, which D-PACE weighs as one."""
    losses, confidences, trained, hits, answers = [], [], [], [], []
    uniform = -math.log(targets.logp.shape[-1])
    for step, logits in enumerate(step_logits):
        answer = shifted(loss_mask, step + 2, False)
        loss, confidence = criterion.score(shifted(targets.logp, step + 1, uniform), logits)
        draft = logits.argmax(-1)
        losses.append(loss)
        confidences.append(confidence)
        trained.append(answer & shifted(targets.in_vocab, step + 1, False))
        hits.append((draft + d2t[draft]) == shifted(targets.argmax, step + 1))
        answers.append(answer)
    trained_all = torch.stack(trained, -1)
    loss = criterion.weigh(torch.stack(losses, -1), torch.stack(confidences, -1), trained_all)
    return [
        StepStats(
            loss_sum=torch.where(trained_all[..., k], loss[..., k], 0.0).sum(),
            loss_count=trained[k].sum(),
            correct=(hits[k] & answers[k]).sum(),
            scored=answers[k].sum(),
        )
        for k in range(len(step_logits))
    ]


def acceptance_length(accuracies: list[float]) -> float:
    """Simulated acceptance length 1 + Σₖ Πᵢ≤ₖ accᵢ (the 1 is the target's bonus token)."""
    total, running = 1.0, 1.0
    for acc in accuracies:
        running *= acc
        total += running
    return total
